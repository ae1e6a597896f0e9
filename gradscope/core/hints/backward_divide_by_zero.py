"""Evidence: a log or division backward whose saved operand (the denominator, or the log's
input) holds exact zeros (or saved nothing readable): its gradient divides by it."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, divisor, where

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
    found = divisor(origin)
    operand = found[1] if found else None
    if operand is not None and not operand.get("zeros"):
        return None
    what = "its input"
    if found is not None and found[0] == "other":
        what = "its saved other (y in xlogy(x, y))" if op == "xlogy" else "its denominator"
    zeros = f" ({operand['zeros']} exact zeros)" if operand else ""
    return (
        f"The gradient of {where(origin)} divides by {what}, which is zero here{zeros}. "
        "Where a torch.where already discards those entries in the forward, keep the zeros "
        "out of the op itself (x / torch.where(y != 0, y, 1)): the discarded branch's "
        "gradient is still computed. Otherwise add an epsilon (log(x + eps), x / (y + eps)) "
        "or clamp the input."
    )
