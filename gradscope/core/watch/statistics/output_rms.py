"""Each watched layer's output RMS, a forward statistic that ``GradientWatch(early_warnings=
True)`` adds beside output max |x|: the typical size of a layer's activations, where max |x|
is its largest. Linear-layer outputs that grow step after step before a divergence (arXiv
2410.16682) grow in RMS, which one outlier token does not move as it moves the max.

It is measured, recorded and plotted, but no detector reads it: a drift rule on it (max
|x|'s: a sustained 4x growth beyond its earlier high) warned on healthy look-alikes of the
drift cases, whose head and attention projections grow 4x in RMS as they learn (the LM head
with z-loss: 0.92 → 3.8 in 23 steps)."""

from __future__ import annotations

import math

import torch
from torch import nn

from gradscope.core.watch.statistics.base import Statistic


class OutputRMS(Statistic):
    """sqrt(mean(x²)) of a module's output, accumulated in float32 (float16 squares
    overflow at 256): one fused norm and one scaling per module call, no copy of a float32
    output. A module called more than once in a step gets its largest. Measured on the
    watch's detail steps (``every``: ``detail_every``), without the warnings' dense start,
    which is there for their detectors: it reads every activation once more (on this CPU,
    resnet18's due step +3.5% with it at every step of the first 100)."""

    name = "out_rms"
    label = "Output RMS"
    combine = "max"
    # Built in: one real value on the output's device by construction (see OutputMaxAbs).
    checked_output = True

    def output(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor | None:
        if output.numel() == 0:  # no size: not applicable, never a made-up 0
            return None
        norm = torch.linalg.vector_norm(output, dtype=torch.float32)
        return norm.mul_(1.0 / math.sqrt(output.numel()))
