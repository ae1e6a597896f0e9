"""Evidence: a softmax or attention op made NaN and its input's maximum is +Inf: softmax
subtracts the row maximum, and Inf - Inf is NaN."""

from __future__ import annotations

import math

from gradscope.core.facts import Origin
from gradscope.core.hints.softmax_fully_masked import SOFTMAXES
from gradscope.core.hints.values import base_op, values, where


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or base_op(origin.op) not in SOFTMAXES:
        return None
    if origin.kind != "nan" or not any(v.get("max") == math.inf for v in values(origin, "inputs")):
        return None
    return (
        f"{where(origin)} produced NaN because its input holds +Inf (max inf): softmax "
        "subtracts the row maximum, and Inf - Inf is NaN. The +Inf came in from "
        "upstream, not from a mask: find where the scores overflow or are set to +Inf."
    )
