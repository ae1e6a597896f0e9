"""Evidence: a sqrt/rsqrt whose input minimum is below 0: the root of a negative number is
NaN."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, fmt, min_input, where


def hint(origin: Origin) -> str | None:
    low = min_input(origin)
    if origin.phase == "backward" or base_op(origin.op) not in ("sqrt", "rsqrt"):
        return None
    if low is None or low >= 0:
        return None
    return (
        f"{where(origin)} got a negative input (minimum {fmt(low)}), which gives NaN. Clamp "
        "the input at 0 (x.clamp_min(0)) and add an epsilon for the gradient."
    )
