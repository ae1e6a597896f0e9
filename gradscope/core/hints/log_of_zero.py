"""Evidence: a log op whose input minimum is exactly 0: log(0) is -Inf."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.backward_divide_by_zero import LOGS
from gradscope.core.hints.values import base_op, min_input, where


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or base_op(origin.op) not in LOGS or min_input(origin) != 0:
        return None
    return (
        f"{where(origin)} got zeros (input minimum 0): log of 0 is -Inf. Add an epsilon "
        "(log(x + 1e-8)), clamp (x.clamp_min(1e-8)), or use log_softmax / logsumexp "
        "instead of log(softmax(...))."
    )
