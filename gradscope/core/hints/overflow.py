"""Evidence: an op went Inf from finite inputs (largest |input| recorded, the module's
buffers left out: a BatchNorm's running_var is not a value the layer was fed): an overflow
of its dtype. Only said of an Inf: a NaN is never called an overflow."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import dtype_of, holds_inf, max_abs, operands, values, where


def hint(origin: Origin) -> str | None:
    inputs = values(origin, "inputs")
    if origin.phase == "backward" or origin.kind != "inf" or holds_inf(inputs):
        return None
    fed = operands(origin)
    dtype = dtype_of(values(origin, "outputs")) or dtype_of(fed) or "its dtype"
    buffers = [v for v in inputs if v.get("buffer")]
    kept = (
        f"; its buffer {buffers[0]['name']} holds values up to {max_abs(buffers[:1]):.3g}"
        if buffers and max_abs(buffers[:1]) > max_abs(fed)
        else ""
    )
    return (
        f"{where(origin)} overflowed {dtype} to Inf from finite inputs (largest |input| "
        f"{max_abs(fed):.3g}{kept}). Lower the learning rate or add gradient clipping so "
        "activations stay in range, normalise this layer's input, or clamp it."
    )
