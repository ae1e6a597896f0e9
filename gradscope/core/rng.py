"""One snapshot of every random generator a training step can draw from, and its restore.

A diagnosis re-run and a rewind must leave the run's random streams exactly where they
would have been: the next dropout mask, the next ``random.shuffle`` and the next
``np.random`` draw are the ones the run would have made without GradScope. The generators
are torch's CPU generator, each CUDA device's (only when CUDA is initialised: reading them
would otherwise initialise it), Python's ``random`` and numpy's global ``np.random``.
Generators that belong to the user (``np.random.default_rng()``, a ``torch.Generator``
passed to a sampler) are the user's objects and are not touched.

Taking a snapshot makes no host synchronisation: every state lives on the host (CUDA's is
a seed and an offset). CUDA's read still costs some microseconds a call (NOTES.md: about 4 µs
on an H200), so the per-step capture takes it only for a forward that draws from it.

CUDA's generator is read and written through :func:`cuda_started`, :func:`_cuda_states` and
:func:`_set_cuda_states` alone: the CPU tests put a stand-in there for CUDA's generator.
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
    and numpy's global generator, as :func:`capture_random_state` found them (Python's and
    numpy's, or torch CPU's, None when not taken)."""

    torch_cpu: torch.Tensor | None
    torch_cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any

    def torch_cuda_moved(self) -> bool:
        """Whether a CUDA generator drew since this state was taken."""
        if self.torch_cuda is None:
            return False
        now = _cuda_states()
        return len(now) != len(self.torch_cuda) or not all(
            torch.equal(a, b) for a, b in zip(now, self.torch_cuda, strict=True)
        )

    def torch_cpu_moved(self) -> bool:
        """Whether torch's CPU generator drew since this state was taken."""
        return self.torch_cpu is not None and not torch.equal(torch.get_rng_state(), self.torch_cpu)

    def host_generators_moved(self) -> bool:
        """Whether Python's or numpy's generator drew since this state was taken."""
        if self.python is not None and random.getstate() != self.python:
            return True
        if self.numpy is not None:
            now = np.random.get_state()
            return now[2] != self.numpy[2] or not np.array_equal(now[1], self.numpy[1])
        return False


# A forward known to draw from no generator keeps this (CUDA not initialised).
NO_RANDOM_STATE = RandomState(None, None, None, None)


def cuda_started() -> bool:
    """Whether CUDA is initialised (its generators exist; reading them earlier would start
    it)."""
    return torch.cuda.is_initialized()


def _cuda_states() -> list[torch.Tensor]:
    return torch.cuda.get_rng_state_all()


def _set_cuda_states(states: list[torch.Tensor]) -> None:
    torch.cuda.set_rng_state_all(states)


def capture_random_state(
    *, host: bool = True, torch_cpu: bool = True, cuda: bool = True
) -> RandomState:
    """The current state of every generator (see the module docstring). ``host=False``
    leaves out Python's and numpy's (tens of microseconds a snapshot), ``torch_cpu=False``
    torch's CPU generator, ``cuda=False`` the CUDA generators (some microseconds): for a
    per-step capture of a forward known not to draw from them."""
    cuda_states = _cuda_states() if cuda and cuda_started() else None
    cpu = torch.default_generator.get_state() if torch_cpu else None
    if not host:
        return RandomState(cpu, cuda_states, None, None)
    return RandomState(cpu, cuda_states, random.getstate(), np.random.get_state())


def restore_random_state(state: RandomState) -> None:
    """Put every generator ``state`` holds back to it."""
    if state.torch_cpu is not None:
        torch.set_rng_state(state.torch_cpu)
    if state.torch_cuda is not None:
        _set_cuda_states(state.torch_cuda)
    if state.python is not None:
        random.setstate(state.python)
    if state.numpy is not None:
        np.random.set_state(state.numpy)
