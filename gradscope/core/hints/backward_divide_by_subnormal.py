"""Evidence: a log or division backward whose divisor, as saved from the forward (the
denominator ``other`` of a division, the ``y`` saved as ``other`` by ``xlogy(x, y)``, a
log's ``self``), holds no exact zero but subnormal values (nonzero, below the smallest
normal number of its dtype: 1.2e-38 in float32): their reciprocal overflows, so the
gradient is Inf although no value is 0."""

from __future__ import annotations

import math

import torch

from gradscope.core.facts import Origin
from gradscope.core.hints.backward_divide_by_zero import DIVISIONS, LOGS
from gradscope.core.hints.values import base_op, divisor, where


def hint(origin: Origin) -> str | None:
    op = base_op(origin.op)
    # atan2 divides by a^2 + b^2, not by a saved operand (backward_half_underflow)
    if origin.phase != "backward" or op not in LOGS | DIVISIONS or op == "atan2":
        return None
    found = divisor(origin)
    if found is None:
        return None
    name, stats = found
    if stats.get("zeros") or not stats.get("subnormal"):
        return None
    dtype = stats.get("dtype", "float32")
    kind = getattr(torch, dtype, torch.float32)
    tiny = torch.finfo(kind).tiny if kind.is_floating_point else math.nan
    role = (
        "the y of xlogy(x, y)"
        if op == "xlogy"
        else ("the denominator" if name == "other" else "its input")
    )
    return (
        f"The gradient of {where(origin)} divides by its saved {name} ({role}): "
        f"{stats['subnormal']} of its values are subnormal, nonzero but below {tiny:.3g}, the "
        f"smallest normal {dtype} (smallest |value| {stats.get('abs_min', math.nan):.3g}), and "
        f"their reciprocal overflows {dtype}. No value is exactly 0, so a test for == 0 "
        "misses them. Clamp it to a floor before the op (y.clamp_min(1e-12) for a "
        "probability; the usual fix, which changes the result only where y is below the "
        "floor), or compute this op in float64."
    )
