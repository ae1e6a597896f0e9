"""The weights' L2 norm per parameter (a layer's: the root of its parameters' sums of
squares): the scale the gradient's norm is read against, and the update ratio's divisor."""

from __future__ import annotations

import numpy as np
import torch

from gradscope.core.watch.figures import accumulation_dtype, stacked_squares
from gradscope.core.watch.statistics.base import Statistic


class WeightNorm(Statistic):
    name = "weight_norm"
    label = "Weight norm"
    combine = "rss"
    scale_power = 0  # of the weights: a loss scale does not touch them
    kept = True  # a frozen parameter's weights do not change: its last figure stands
    on_trouble = True

    def fused(self, grads, params, *, per_tensor, sizes):
        return torch._foreach_norm(params, 2, dtype=accumulation_dtype(params[0]))

    def stacked(self, grads, params):
        return stacked_squares(params)  # float64 sums of squares: exact

    def from_stacked(self, values: np.ndarray) -> np.ndarray:
        return np.sqrt(values)
