"""Evidence: a division's numerator and denominator as recorded (their exact zeros): a NaN
with zeros on both sides is 0/0; an Inf with zeros in the denominator is x/0. Where the
values do not show which (a Python-number denominator, no zeros recorded), the hint says
what it knows and stops."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.backward_divide_by_zero import DIVISIONS
from gradscope.core.hints.values import base_op, holds_inf, values, where


def hint(origin: Origin) -> str | None:
    op = base_op(origin.op)
    if origin.phase == "backward" or op not in DIVISIONS:
        return None
    inputs = values(origin, "inputs")
    if holds_inf(inputs):
        return None  # Inf/Inf or Inf*0: the non-finite-input rule says it
    numerator = inputs[0] if inputs else {}
    denominator = inputs[1] if len(inputs) > 1 else None
    if op in ("reciprocal", "__rtruediv__"):
        numerator, denominator = {}, inputs[0] if inputs else None
    under = denominator.get("zeros", 0) if denominator else 0
    fix = (
        "Mask those entries out before dividing (torch.where(d != 0, n / d, 0)), or add an "
        "epsilon to a denominator that is a measured quantity (a norm, a std); a "
        "denominator that is a count (a number of valid items) is clamped instead "
        "(count.clamp(min=1)): an epsilon makes a nonzero numerator 1/eps times too large."
    )
    if origin.kind == "nan":
        if under and numerator.get("zeros"):
            return (
                f"{where(origin)} computed 0/0 (NaN): the numerator holds "
                f"{numerator['zeros']} exact zeros and the denominator {under}. " + fix
            )
        return (
            f"{where(origin)} made NaN from finite inputs: a division gives NaN only for 0/0, "
            "and the recorded values do not show where both are 0 (see them below). " + fix
        )
    if under:
        return (
            f"{where(origin)} divided by zero: the denominator holds {under} exact zeros "
            "(a non-zero value over 0 is Inf). " + fix
        )
    return (
        f"{where(origin)} divided by zero or by a value so small that the quotient "
        "overflowed (the denominator is not among the recorded tensors: a Python number?). " + fix
    )
