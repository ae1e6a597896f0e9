"""Evidence: the loss code's op went Inf from finite inputs (largest |input| recorded):
the loss value itself is too large for its dtype. Its ``reduction`` argument (a sum of every
element's loss) and its dtype decide what is advised."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import (
    argument,
    dtype_of,
    holds_inf,
    max_abs,
    operands,
    values,
    where,
)


def hint(origin: Origin) -> str | None:
    inputs = values(origin, "inputs")
    if origin.phase != "loss" or origin.kind != "inf" or holds_inf(inputs):
        return None
    reduction = argument(origin, "reduction")
    dtype = dtype_of(values(origin, "outputs")) or dtype_of(operands(origin)) or "its dtype"
    summed = (
        "reduction='sum' adds every element's loss: reduction='mean' keeps it in range. "
        if reduction == "sum"
        else ""
    )
    wider = "compute the loss in float32, " if dtype in ("float16", "bfloat16") else ""
    return (
        f"The loss computation ({where(origin)}) overflowed {dtype} to Inf from finite values "
        f"(largest |input| {max_abs(operands(origin)):.3g}): the loss is too large for its "
        f"dtype. {summed}Normalise the targets, {wider}and look for exploding activations "
        "upstream (the largest input above)."
    )
