"""The largest |g| of each gradient (a layer's: the largest of its parameters'): one bad
element stands out here before it moves the norm; it also tells the reads when a float32
norm may have lost squares that underflowed."""

from __future__ import annotations

import numpy as np
import torch

import gradscope.core.watch.figures as tensor_reads
from gradscope.core.watch.figures import stacked_max, values_of
from gradscope.core.watch.statistics.base import Statistic

# On a CPU, up to this many elements a gradient's max |g| comes from one fused ord-inf norm
# over all such gradients, above it from one aminmax each: the fused ord-inf kernel is slow
# per element there (2.4 ms against 0.15 ms over the benchmark MLP's 1.3M elements), and an
# aminmax call costs a few microseconds whatever its size.
FUSED_UP_TO = 4096


class MaxAbs(Statistic):
    name = "max_abs"
    label = "Max |gradient|"
    combine = "max"
    scale_power = 1
    on_trouble = True

    def __init__(self) -> None:
        # (sizes, per_tensor) -> (positions read fused, how to lay out each parameter)
        self._plans: dict[tuple, tuple[list[int], list[tuple[int, int]]]] = {}

    def width(self, per_tensor: bool) -> int:
        return 2 if per_tensor else 1  # (min, max) pairs on a CPU; max |g| = max(max, -min)

    def _plan(self, sizes: tuple[int, ...], per_tensor: bool):
        key = (sizes, per_tensor)
        plan = self._plans.get(key)
        if plan is None:
            fused = [k for k, n in enumerate(sizes) if n and (n <= FUSED_UP_TO or not per_tensor)]
            slot = {k: j for j, k in enumerate(fused)}
            # per parameter: 0 empty, 1 fused (its slot), 2 aminmax
            layout = [
                (0, 0) if not n else ((1, slot[k]) if k in slot else (2, k))
                for k, n in enumerate(sizes)
            ]
            plan = self._plans[key] = (fused, layout)
        return plan

    def fused(self, grads, params, *, per_tensor, sizes):
        if sizes is None:  # a sparse gradient: its stored values, whatever their number
            sizes = tuple(g.numel() for g in grads)
        fused, layout = self._plan(sizes, per_tensor)
        if len(fused) == len(grads) and not per_tensor:
            return list(torch._foreach_norm(grads, float("inf")))  # the common case on CUDA
        read = torch._foreach_norm([grads[k] for k in fused], float("inf")) if fused else []
        complex_values = grads[0].is_complex()
        zero = None
        found: list[torch.Tensor] = []
        for kind, where in layout:
            if kind == 1:  # a small gradient: its max |g| fills both slots of its pair
                value = read[where]
                found += (value, value) if per_tensor else (value,)
            elif kind == 2:
                g = grads[where]
                found += torch.aminmax(g.abs() if complex_values else g)
            else:  # a sparse gradient storing nothing, an empty parameter: 0
                if zero is None:
                    dtype = grads[0].real.dtype if complex_values else grads[0].dtype
                    zero = grads[0].new_zeros((), dtype=dtype)
                found += (zero, zero) if per_tensor else (zero,)
        return found

    def stacked(self, grads, params):
        return stacked_max(grads)

    def shard_values(self, grads, params):
        grads = [values_of(g) for g in grads]
        if grads[0].device.type in tensor_reads.PER_TENSOR_DEVICES:
            # On a CPU one aminmax per tensor is about 13x faster than _foreach_norm's ord
            # inf (measured on 40 local shards, one thread): max |g| = max(max, -min).
            pairs = [torch.aminmax(g) for g in grads]
            lows = torch.stack([pair[0] for pair in pairs])
            highs = torch.stack([pair[1] for pair in pairs])
            return torch.maximum(highs, -lows)
        return torch.stack(torch._foreach_norm(grads, float("inf")))

    def from_fused(self, values: np.ndarray, per_tensor: bool) -> np.ndarray:
        if per_tensor:
            return np.abs(values).reshape(-1, 2).max(axis=1)
        return values
