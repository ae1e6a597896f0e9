"""The largest |g| of each gradient (a layer's: the largest of its parameters'): one bad
element stands out here before it moves the norm; it also tells the reads when a float32
norm may have lost squares that underflowed."""

from __future__ import annotations

import numpy as np
import torch

from gradscope.core.watch.figures import stacked_max
from gradscope.core.watch.statistics.base import Statistic

# On a CPU, up to this many elements a gradient's max |g| comes from one fused ord-inf norm
# over all such gradients, above it from one aminmax each: the fused ord-inf kernel is slow
# per element there (2.4 ms against 0.15 ms over the benchmark MLP's 1.3M elements), and an
# aminmax call costs a few microseconds whatever its size.
FUSED_UP_TO = 4096


class MaxAbs(Statistic):
    name = "max_abs"
    per_layer = "max"
    scale_power = 1

    def width(self, per_tensor: bool) -> int:
        return 2 if per_tensor else 1  # (min, max) pairs on a CPU; max |g| = max(max, -min)

    def fused(self, grads, params, *, per_tensor, maybe_empty):
        if not per_tensor and not maybe_empty:
            return list(torch._foreach_norm(grads, float("inf")))
        # Small and empty gradients apart; on a CPU the large ones by one aminmax each. A
        # small one's max |g| fills both slots of its pair.
        small = [g for g in grads if 0 < g.numel() <= FUSED_UP_TO or (g.numel() and not per_tensor)]
        fused = iter(torch._foreach_norm(small, float("inf")) if small else ())
        zero = None
        found: list[torch.Tensor] = []
        for g in grads:
            size = g.numel()
            if not size:  # a sparse gradient storing nothing, an empty parameter: 0
                if zero is None:
                    zero = g.new_zeros((), dtype=g.real.dtype if g.is_complex() else g.dtype)
                found += [zero, zero] if per_tensor else [zero]
            elif size <= FUSED_UP_TO or not per_tensor:
                value = next(fused)
                found += [value, value] if per_tensor else [value]
            else:
                found += torch.aminmax(g.abs() if g.is_complex() else g)
        return found

    def stacked(self, grads, params):
        return stacked_max(grads)

    def from_fused(self, values: np.ndarray, per_tensor: bool) -> np.ndarray:
        if per_tensor:
            return np.abs(values).reshape(-1, 2).max(axis=1)
        return values
