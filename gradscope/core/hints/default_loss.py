"""Evidence: the loss op ran inside GradScope's own default loss (``runner.default_loss``:
MSE for float targets, cross-entropy for class indices), because the script defines no
``loss_fn``; the largest |input| it was given is recorded."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import evidence, finite_max_abs, values


def hint(origin: Origin) -> str | None:
    if not evidence(origin, "default_loss"):
        return None
    name = "MSE" if "mse" in (origin.op or "") else "cross-entropy"
    largest = finite_max_abs(values(origin, "inputs"))
    made = "overflowed to Inf" if origin.kind == "inf" else "became NaN"
    return (
        f"Your script has no loss_fn, so GradScope's default {name} loss ran, and it {made} "
        f"(largest finite |input| {largest:.3g}). This is GradScope's loss, not yours: define "
        "loss_fn(output, target) in the script with the loss you train with (and a "
        "reduction that keeps it in range), or scale the model's output and targets."
    )
