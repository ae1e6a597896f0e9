"""Evidence: an atan2 (or hypot) backward in float16/bfloat16 went non-finite although
neither saved operand holds an exact zero, and the squares of their smallest magnitudes
sum to 0 in that dtype: its derivative divides by a^2 + b^2, which underflowed (float16's
smallest value is 6e-8, so |a|, |b| below about 2e-4 square to 0)."""

from __future__ import annotations

import torch

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, saved, where

OPS = {"atan2", "arctan2", "hypot"}


def hint(origin: Origin) -> str | None:
    if origin.phase != "backward" or base_op(origin.op) not in OPS:
        return None
    first, second = saved(origin, "self"), saved(origin, "other")
    if first is None or second is None or first.get("zeros") or second.get("zeros"):
        return None
    dtype = first.get("dtype")
    if dtype not in ("float16", "bfloat16"):
        return None
    kind = getattr(torch, dtype)
    a = torch.tensor(first.get("abs_min", 1.0), dtype=kind)
    b = torch.tensor(second.get("abs_min", 1.0), dtype=kind)
    if float(a * a + b * b) != 0.0:
        return None
    smallest = torch.finfo(kind).smallest_normal * 2.0**-10 if dtype == "float16" else None
    floor = f" (its smallest value is {smallest:.2g})" if smallest else ""
    return (
        f"The gradient of {where(origin)} divides by a^2 + b^2, which is 0 here only because "
        f"it underflowed in {dtype}{floor}: the smallest saved operands (self "
        f"{first['abs_min']:.3g}, other {second['abs_min']:.3g}) are not 0, but their "
        f"squares are below what {dtype} can hold. The dtype is the cause: compute this op "
        "in float32 (torch.atan2(a.float(), b.float())), the usual fix, which leaves the "
        "angle unchanged; an epsilon added to the operands would bias the angle."
    )
