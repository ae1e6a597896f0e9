"""Evidence: the gradient arriving at or leaving the op is float16/bfloat16 and went Inf
from a finite incoming one: half precision tops out at 65,504."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import is_half, max_abs, values


def hint(origin: Origin) -> str | None:
    if origin.phase != "backward" or origin.kind != "inf":
        return None
    arriving, leaving = values(origin, "grad_in"), values(origin, "grad_out")
    if not (is_half(arriving) or is_half(leaving)):
        return None
    return (
        f"A half-precision gradient overflowed: the gradient arriving was at most "
        f"{max_abs(arriving):.3g}, and float16 tops out at 65,504. Use torch.amp.GradScaler "
        "with a dynamic scale, compute this part in float32, or use bfloat16."
    )
