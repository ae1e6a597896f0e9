"""Evidence: an acos/asin/atanh backward went non-finite from a finite incoming gradient:
their derivatives are infinite at +-1, the edge of their domain."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, where


def hint(origin: Origin) -> str | None:
    if origin.phase != "backward" or base_op(origin.op) not in ("acos", "asin", "atanh"):
        return None
    return (
        f"The derivative of {where(origin)} is infinite at +-1. Clamp the input to "
        "[-1 + eps, 1 - eps]."
    )
