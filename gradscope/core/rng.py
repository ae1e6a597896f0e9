"""One snapshot of every random generator a training step can draw from, and its restore.

A diagnosis re-run and a rewind must leave the run's random streams exactly where they
would have been: the next dropout mask, the next ``random.shuffle`` and the next
``np.random`` draw are the ones the run would have made without GradScope. The generators
are torch's CPU generator, each CUDA device's (only when CUDA is initialised: reading them
would otherwise initialise it), Python's ``random`` and numpy's global ``np.random``.
Generators that belong to the user (``np.random.default_rng()``, a ``torch.Generator``
passed to a sampler) are the user's objects and are not touched.

Taking a snapshot makes no host synchronisation: every state lives on the host (CUDA's is
a seed and an offset).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class RandomState:
    """The states of torch CPU, CUDA (None when CUDA was not initialised), Python ``random``
    and numpy's global generator, as :func:`capture_random_state` found them."""

    torch_cpu: torch.Tensor
    torch_cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any


def capture_random_state() -> RandomState:
    """The current state of every generator (see the module docstring)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return RandomState(torch.get_rng_state(), cuda, random.getstate(), np.random.get_state())


def restore_random_state(state: RandomState) -> None:
    """Put every generator back to ``state``."""
    torch.set_rng_state(state.torch_cpu)
    if state.torch_cuda is not None:
        torch.cuda.set_rng_state_all(state.torch_cuda)
    random.setstate(state.python)
    np.random.set_state(state.numpy)
