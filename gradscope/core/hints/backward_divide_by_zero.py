"""Evidence: a log or division backward whose saved operand (the denominator, or the log's
input) holds exact zeros (or saved nothing readable): its gradient divides by it."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, saved, where

LOGS = {"log", "log2", "log10", "log1p", "xlogy", "log_softmax", "logit", "digamma", "lgamma"}
DIVISIONS = {
    "div",
    "true_divide",
    "__truediv__",
    "__rtruediv__",
    "reciprocal",
    "divide",
    "fmod",
    "remainder",
    "atan2",
}


def hint(origin: Origin) -> str | None:
    op = base_op(origin.op)
    if origin.phase != "backward" or op not in LOGS | DIVISIONS:
        return None
    operand = saved(origin, "other") if op in DIVISIONS else None
    operand = operand or saved(origin, "self")
    if operand is not None and not operand.get("zeros"):
        return None
    zeros = f" ({operand['zeros']} exact zeros)" if operand else ""
    return (
        f"The gradient of {where(origin)} divides by its input, which is zero here{zeros}. "
        "Add an epsilon (log(x + eps), x / (y + eps)) or clamp the input."
    )
