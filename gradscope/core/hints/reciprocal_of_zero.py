"""Evidence: an rsqrt/reciprocal whose input minimum is exactly 0: 1/0 is Inf."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, min_input, where


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or base_op(origin.op) not in ("rsqrt", "reciprocal"):
        return None
    if min_input(origin) != 0:
        return None
    return (
        f"{where(origin)} got zeros (input minimum 0): 1/sqrt(0) and 1/0 are Inf. Add an "
        "epsilon to its input (rsqrt(var + 1e-5))."
    )
