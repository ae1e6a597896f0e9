"""Each watched layer's output max |x|, a forward statistic that the early warnings read
(gradscope.core.warnings; ``GradientWatch(early_warnings=True)`` adds it). It notes each
module's output dtype as it goes (metadata only: no host synchronisation), since the limits
a value must stay within are its dtype's."""

from __future__ import annotations

import torch
from torch import nn

from gradscope.core.warnings import schedule
from gradscope.core.watch.statistics.base import Statistic


class OutputMaxAbs(Statistic):
    """The watch reads it through :meth:`extremes`, one reduction per module call and no
    copy of the output (``abs()`` would write one), then one :meth:`from_extremes` over
    every module at once when the step is collected; :meth:`output` is the same figure by
    the plain protocol."""

    name = "out_max_abs"
    label = "Output max |x|"
    combine = "max"
    # Built in: what it returns is one real value on the output's device by construction,
    # so the watch skips the checks a user's statistic gets.
    checked_output = True

    def due(self, step: int, detail_every: int) -> bool:
        """The early warnings' schedule (gradscope.core.warnings.schedule), not ``every``."""
        return schedule.due(step, detail_every)

    def __init__(self) -> None:
        self.dtypes: dict[int, torch.dtype] = {}
        self._zeros: dict[torch.device, torch.Tensor] = {}

    def output(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor:
        self.dtypes[id(module)] = output.dtype
        if output.numel() == 0:  # amax of nothing raises; an empty output has no size
            return output.new_zeros((), dtype=torch.float32)
        # amax of the dtype's own values is exact; float() only for the one transfer.
        return output.abs().amax().float()

    def extremes(self, module: nn.Module, output: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output's smallest and largest value (0-d, its dtype): one reduction."""
        self.dtypes[id(module)] = output.dtype
        if output.numel() == 0:
            zero = self._zeros.get(output.device)
            if zero is None:
                zero = self._zeros[output.device] = output.new_zeros((), dtype=torch.float32)
            return zero, zero
        return torch.aminmax(output)

    @staticmethod
    def from_extremes(lowest: torch.Tensor, highest: torch.Tensor) -> torch.Tensor:
        """max |x| of each module from the stacked extremes of its outputs (float32)."""
        return torch.maximum(highest, lowest.neg()).float()
