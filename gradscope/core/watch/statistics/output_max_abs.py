"""Each watched layer's output max |x|, a forward statistic that the early warnings read
(gradscope.core.warnings; ``GradientWatch(early_warnings=True)`` adds it). It notes each
module's output dtype as it goes (metadata only: no host synchronisation), since the limits
a value must stay within are its dtype's."""

from __future__ import annotations

import torch
from torch import nn

from gradscope.core.watch.statistics.base import Statistic


class OutputMaxAbs(Statistic):
    name = "out_max_abs"
    label = "Output max |x|"
    combine = "max"

    def __init__(self) -> None:
        self.dtypes: dict[int, torch.dtype] = {}

    def output(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor:
        self.dtypes[id(module)] = output.dtype
        if output.numel() == 0:  # amax of nothing raises; an empty output has no size
            return output.new_zeros((), dtype=torch.float32)
        # amax of the dtype's own values is exact; float() only for the one transfer.
        return output.abs().amax().float()
