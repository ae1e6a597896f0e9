"""Evidence: a sqrt/rsqrt/pow/norm backward whose saved forward values hold exact zeros (or
saved nothing readable): the derivative 1/(2 sqrt(x)) is infinite there. The saved values'
dtype decides the epsilon (1e-12 rounds to 0 in float16) and whether rounding may have made
the zeros."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, saved, where

ROOTS = {"sqrt", "rsqrt", "pow", "norm", "vector_norm"}


def hint(origin: Origin) -> str | None:
    if origin.phase != "backward" or base_op(origin.op) not in ROOTS:
        return None
    forward = saved(origin, "result", "self")
    if forward is not None and not forward.get("zeros"):
        return None
    zeros = (
        f"; {forward['zeros']} of the values it saved from the forward are exactly 0"
        if forward
        else ""
    )
    dtype = (forward or {}).get("dtype")
    epsilon = "1e-6, since 1e-12 rounds to 0 in float16" if dtype == "float16" else "1e-12"
    rounding = (
        f" In {dtype}, a small variance or norm can also round to exactly 0 (E(x^2) - "
        "E(x)^2 cancels): if this value is one, compute it in float32 or in two passes."
        if dtype in ("float16", "bfloat16")
        else ""
    )
    return (
        f"The derivative of {where(origin)} is infinite at 0 (d/dx sqrt(x) = 1/(2 sqrt(x)))"
        f"{zeros}: the forward pass was finite but the gradient is not. Add a small "
        f"epsilon inside (sqrt(x + eps), eps = {epsilon}), clamp the input away from 0, or "
        "use a safe norm that special-cases zero vectors." + rounding
    )
