"""Evidence: an op went Inf from finite inputs (largest |input| recorded): an overflow of
its dtype. Only said of an Inf: a NaN is never called an overflow."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import dtype_of, holds_inf, max_abs, values, where


def hint(origin: Origin) -> str | None:
    inputs = values(origin, "inputs")
    if origin.phase == "backward" or origin.kind != "inf" or holds_inf(inputs):
        return None
    dtype = dtype_of(values(origin, "outputs")) or dtype_of(inputs) or "its dtype"
    return (
        f"{where(origin)} overflowed {dtype} to Inf from finite inputs (largest |input| "
        f"{max_abs(inputs):.3g}). Lower the learning rate or add gradient clipping so "
        "activations stay in range, normalise this layer's input, or clamp it."
    )
