"""Evidence: a backward op turned a finite incoming gradient (largest |value| recorded)
into an Inf one: an overflow. A NaN made there is not called an overflow."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import max_abs, values, where


def hint(origin: Origin) -> str | None:
    if origin.phase != "backward":
        return None
    arriving = max_abs(values(origin, "grad_in"))
    if origin.kind != "inf":
        return (
            f"The gradient of {where(origin)} became NaN although the gradient arriving was "
            f"finite (largest |value| {arriving:.3g}): the op's derivative is undefined at "
            "the values it saved (see them below). GradScope cannot tell more from them."
        )
    return (
        f"The gradient became Inf in {where(origin)} while the gradient arriving there was "
        f"finite (largest |value| {arriving:.3g}): it overflowed. Clip gradients "
        "(clip_grad_norm_), lower the learning rate or the loss scale, and check for large "
        "activations feeding this layer."
    )
