"""The step a training library runs, kept so the watch can repeat it: a callback knows the
step better than the model does (Lightning's ``training_step`` often never calls the
LightningModule's own ``forward``; the Trainer's ``compute_loss`` may compute the loss
outside the model). Each micro-batch of an optimizer step is kept with the random state it
started from; the repeat runs them all again and sums their losses, so the first NaN/Inf in
execution order is found, in the model or in the loss code."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from gradscope.core.invisible_rerun import start_from
from gradscope.core.rng import RandomState, capture_random_state
from gradscope.core.tensor_tree import loss_from_output

# Micro-batches of one optimizer step kept for the repeat (references, not copies).
MAX_KEPT = 64


@dataclass
class _MicroBatch:
    step: Callable[[], Any]
    random_state: RandomState


class KeptSteps:
    """The micro-batches of the current optimizer step. ``context``: made anew for each
    repeated micro-batch (the library's autocast context)."""

    def __init__(self, context: Callable[[], AbstractContextManager] | None = None) -> None:
        self._kept: list[_MicroBatch] = []
        self._context = context or nullcontext

    def keep(self, step: Callable[[], Any]) -> None:
        """``step`` recomputes one micro-batch's loss (or an output holding it); called with
        the random state as it is now."""
        self._kept.append(_MicroBatch(step, capture_random_state()))
        del self._kept[:-MAX_KEPT]

    def take(self) -> Callable[[], torch.Tensor] | None:
        """A ``locate`` function for the watch repeating the step's micro-batches, or None
        when none was kept; the next :meth:`keep` starts the next step."""
        kept, self._kept = self._kept, []
        if not kept:
            return None

        def locate() -> torch.Tensor:
            total = None
            for micro_batch in kept:
                start_from(micro_batch.random_state, ())
                with self._context():
                    loss = loss_from_output(micro_batch.step())
                if total is None:
                    total = loss
                else:
                    with torch._C.DisableTorchFunction():  # GradScope's sum, not the user's op
                        total = total + loss
            return total

        return locate

    def clear(self) -> None:
        self._kept.clear()
