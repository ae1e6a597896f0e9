"""Evidence: an op went Inf from finite inputs (largest |input| recorded, the module's
buffers left out: a BatchNorm's running_var is not a value the layer was fed): an overflow
of its dtype. Only said of an Inf: a NaN is never called an overflow. A product over many
values (prod, cumprod) gets the log-space remedy, a power its exponent (an argument)."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import (
    argument,
    base_op,
    dtype_of,
    holds_inf,
    max_abs,
    operands,
    values,
    where,
)

PRODUCTS = {"prod", "cumprod"}


def hint(origin: Origin) -> str | None:
    inputs = values(origin, "inputs")
    if origin.phase == "backward" or origin.kind != "inf" or holds_inf(inputs):
        return None
    fed = operands(origin)
    dtype = dtype_of(values(origin, "outputs")) or dtype_of(fed) or "its dtype"
    start = (
        f"{where(origin)} overflowed {dtype} to Inf from finite inputs (largest |input| "
        f"{max_abs(fed):.3g}). "
    )
    exponent = argument(origin, "exponent", "arg1")
    if (
        base_op(origin.op) in ("pow", "__pow__", "float_power")
        and isinstance(exponent, (int, float))
        and not isinstance(exponent, bool)
        and exponent > 1
    ):
        return start + (
            f"x ** {exponent:g} of values up to {max_abs(fed):.3g} exceeds {dtype}: keep the "
            "base small (normalise it), or work with its log (exponent * log(x)) where only "
            "ratios or logs of the power are needed."
        )
    if base_op(origin.op) in PRODUCTS:
        return start + (
            "A product of many values grows geometrically: compute it in log space "
            "(torch.cumsum(torch.log(x), dim) instead of torch.cumprod(x, dim), exp only "
            "where needed)."
        )
    return start + (
        "Lower the learning rate or add gradient clipping so activations stay in range, "
        "normalise this layer's input, or clamp it."
    )
