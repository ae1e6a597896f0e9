"""Evidence: a log op whose input minimum is below 0: the log of a negative number is NaN."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.backward_divide_by_zero import LOGS
from gradscope.core.hints.log_of_zero import NOT_LOGS
from gradscope.core.hints.values import base_op, fmt, min_input, where


def hint(origin: Origin) -> str | None:
    low = min_input(origin)
    if origin.phase == "backward" or base_op(origin.op) not in LOGS - NOT_LOGS:
        return None
    if low is None or low >= 0:
        return None
    return (
        f"{where(origin)} got negative inputs (minimum {fmt(low)}): the log of a negative "
        "number is NaN, so its input is not the positive quantity the code assumes (a missing "
        "softplus/exp/ReLU, a subtraction that went below 0). Make it positive by "
        "construction; clamping only hides the sign error."
    )
