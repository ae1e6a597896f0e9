"""Evidence: a backward op made NaN from a finite incoming gradient, and the values it saved
from the forward (or the gradient arriving) reach magnitudes of 1e6 or more: products in
its derivative overflowed to Inf, and Inf - Inf is NaN. Values that large come from
weights that grew, not from the op's domain."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import finite_max_abs, values, where

LARGE = 1e6


def hint(origin: Origin) -> str | None:
    if origin.phase != "backward" or origin.kind != "nan" or origin.details.get("custom_function"):
        return None
    kept = values(origin, "saved")
    largest_saved = finite_max_abs(kept)
    arriving = finite_max_abs(values(origin, "grad_in"))
    if max(largest_saved, arriving) < LARGE:
        return None
    which = (
        f"the values it saved from the forward reach {largest_saved:.3g}"
        if largest_saved >= LARGE
        else f"the gradient arriving reaches {arriving:.3g}"
    )
    return (
        f"The gradient of {where(origin)} became NaN from a finite incoming gradient because "
        f"{which}: products in its derivative overflowed to Inf, and Inf - Inf is NaN. The "
        "op is not at fault; activations this large come from weights that grew, usually "
        "because the learning rate is too high for this model (a loss that rose by orders "
        "of magnitude before this step confirms it), or from inputs that were never "
        "normalised. Lower the learning rate or warm it up, clip gradients "
        "(clip_grad_norm_), and resume from a checkpoint before the blow-up."
    )
