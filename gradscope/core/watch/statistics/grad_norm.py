"""The gradient's L2 norm per parameter (a layer's: the root of its parameters' sums of
squares), on every step: the figure each status is decided from. The watch reads it itself,
as the step's one fused ``torch._foreach_norm`` over every gradient (equal to
``clip_grad_norm_``'s), since every other figure of a step hangs on it (gradscope.core.watch.
reads); NaN and Inf propagate into it, so it also flags a non-finite gradient."""

from __future__ import annotations

from gradscope.core.watch.statistics.base import Statistic


class GradNorm(Statistic):
    name = "grad_norm"
    label = "Gradient norm"
    combine = "rss"
    every = 1
    read_by_watch = True
