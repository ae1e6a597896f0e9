"""The output head's log-partition, a forward statistic that the early warnings read
(gradscope.core.warnings; ``GradientWatch(early_warnings=True)`` adds it)."""

from __future__ import annotations

import torch
from torch import nn

from gradscope.core.warnings import schedule
from gradscope.core.watch.statistics.base import Statistic


class OutputLogPartition(Statistic):
    """The output head's log-partition, max over its rows of ``logsumexp(logits, -1)``: what
    z-loss keeps near 0, and what an exp of the logits in their dtype overflows beyond
    (11.09 in float16). The head is the ``nn.Linear`` the forward calls last; on the first
    due step every Linear is measured to find it (those figures are real: each Linear's own
    output log-partition, kept as measured), then the head alone: every other layer is not
    applicable (None: absent, never a made-up 0), as is every module that is not a Linear
    with logits. ``dtypes``: the dtype an exp of the head's logits runs in, by module: the
    logits' own, but float32 under autocast, which runs softmax, log_softmax and
    cross-entropy in float32 whatever the logits' dtype."""

    name = "out_log_partition"
    label = "Output head log-partition"
    combine = "max"
    # Built in: one real value on the output's device by construction (see OutputMaxAbs).
    checked_output = True

    def due(self, step: int, detail_every: int) -> bool:
        """The early warnings' schedule (gradscope.core.warnings.schedule), not ``every``."""
        return schedule.due(step, detail_every)

    def __init__(self) -> None:
        self.head: int | None = None
        self.dtypes: dict[int, torch.dtype] = {}
        self._calls: dict[int, int] = {}

    def output(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor | None:
        if not isinstance(module, nn.Linear) or output.dim() == 0 or output.shape[-1] < 2:
            return None
        if output.numel() == 0:
            return None
        self._calls[id(module)] = len(self._calls)
        autocast = torch.is_autocast_enabled(output.device.type)
        self.dtypes[id(module)] = torch.float32 if autocast else output.dtype
        if self.head is not None and id(module) != self.head:
            return None
        return output.float().logsumexp(-1).amax()

    def settle(self) -> int | None:
        """After a due step: the head (``id`` of the Linear called last), or None."""
        if self._calls:
            self.head = max(self._calls, key=self._calls.__getitem__)
            self._calls.clear()
        return self.head
