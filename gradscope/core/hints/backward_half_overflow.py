"""Evidence: the gradient arriving at or leaving the op is float16/bfloat16 and went Inf
from a finite incoming one: half precision tops out at 65,504. Whether the loop already has
a loss scaler (the watch says so) decides whether one is advised."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import dtype_of, is_half, max_abs, scaler_and_autocast, values


def hint(origin: Origin) -> str | None:
    if origin.phase != "backward" or origin.kind != "inf":
        return None
    arriving, leaving = values(origin, "grad_in"), values(origin, "grad_out")
    if not (is_half(arriving) or is_half(leaving)):
        return None
    dtype = dtype_of(leaving) or dtype_of(arriving) or "float16"
    limit = "float16 tops out at 65,504" if dtype == "float16" else f"{dtype} overflowed"
    scaler, _ = scaler_and_autocast(origin)
    remedy = (
        "Your loop already scales the loss with a GradScaler, and this gradient overflows "
        "anyway: compute this part in float32, or use bfloat16 (float32's range)."
        if scaler
        else "Use torch.amp.GradScaler with a dynamic scale, compute this part in float32, "
        "or use bfloat16."
    )
    return (
        f"A half-precision gradient overflowed: the gradient arriving was at most "
        f"{max_abs(arriving):.3g}, and {limit}. " + remedy
    )
