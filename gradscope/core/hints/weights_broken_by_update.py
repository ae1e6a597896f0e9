"""Evidence: the weights were finite at an earlier step and NaN/Inf before this step's
forward (phase "update"): the previous optimizer update wrote them; their dtype says
whether half precision is involved, and whether the loop already has a loss scaler (the
watch says so) whether one is advised."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import is_half, scaler_and_autocast, values


def hint(origin: Origin) -> str | None:
    if origin.phase != "update":
        return None
    half = is_half(values(origin, "weights"))
    scaler, _ = scaler_and_autocast(origin)
    master = (
        "float32 weights (leave the model in float32 and let autocast cast per op; your "
        "GradScaler stays as it is)"
        if scaler
        else "float32 master weights (autocast + GradScaler)"
    )
    return (
        f"The weights of {origin.module or '(model)'} were already NaN/Inf before this "
        f"step's forward pass: the optimizer update ({origin.op or 'optimizer.step'}) of "
        "the previous step wrote them. "
        + (
            "They are half precision: Adam's eps (1e-8) rounds to 0 in float16, so "
            "an update divides by zero, and small updates underflow. Keep "
            + master
            + ", use bfloat16, or raise eps to 1e-4. "
            if half
            else "A learning rate too high for these gradients is the usual cause: lower "
            "it, clip gradients, or check for a division by a tiny second-moment estimate. "
        )
        + "Rewind to before that step to try another setting."
    )
