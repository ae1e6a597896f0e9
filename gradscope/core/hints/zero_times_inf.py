"""Evidence: a multiplication made NaN, one of its operands is a Python number equal to 0
(recorded among the call's plain arguments, where tensors alone would not show it), and
its tensor operand holds Inf: 0 * Inf is NaN. A loss term weighted 0 (a warm-up or an
annealing schedule at its start) whose value is Inf is the usual shape."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import (
    base_op,
    evidence,
    holds_inf,
    origin_of_inf,
    values,
    where,
)

PRODUCTS = {"mul", "__mul__", "__rmul__", "multiply"}


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or origin.kind != "nan" or base_op(origin.op) not in PRODUCTS:
        return None
    given = evidence(origin, "arguments") or {}
    zero = next(
        (
            k
            for k, v in given.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0
        ),
        None,
    )
    inputs = values(origin, "inputs")
    if zero is None or not holds_inf(inputs):
        return None
    low, high = inputs[0].get("min"), inputs[0].get("max")
    sign = "-inf" if low == float("-inf") and high != float("inf") else "Inf"
    source = origin_of_inf(origin)
    came = (
        f" The {sign} was written on purpose by {source}."
        if source
        else " The Inf itself came from upstream (its values are below)."
    )
    return (
        f"{where(origin)} multiplied a tensor holding {sign} by the Python number "
        f"{given[zero]!r} (argument {zero}): 0 * Inf is NaN, so a factor of 0 does not remove "
        f"an infinite term.{came} Skip the term when its factor is 0 (if w: loss = loss + w "
        "* term), or select rather than multiply (torch.where(keep, x, 0))."
    )
