"""Evidence: the loss code's op went Inf from finite inputs (largest |input| recorded):
the loss value itself is too large for its dtype."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import holds_inf, max_abs, operands, values, where


def hint(origin: Origin) -> str | None:
    inputs = values(origin, "inputs")
    if origin.phase != "loss" or origin.kind != "inf" or holds_inf(inputs):
        return None
    return (
        f"The loss computation ({where(origin)}) overflowed to Inf from finite values (largest "
        f"|input| {max_abs(operands(origin)):.3g}): the loss is too large for its dtype. Lower "
        "the loss scale, use mean instead of sum reduction, normalise the targets or compute "
        "the loss in float32, and look for exploding activations upstream."
    )
