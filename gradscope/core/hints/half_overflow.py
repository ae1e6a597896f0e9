"""Evidence: the op's output is float16/bfloat16 and Inf, while its largest |input| (the
module's buffers left out) is below float16's maximum (65,504): the result overflowed half
precision only. Whether autocast was on when it ran, and whether the loop has a loss
scaler (the watch says so), decide the remedy: neither is advised to a script using it."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import (
    FLOAT16_MAX,
    is_half,
    max_abs,
    operands,
    scaler_and_autocast,
    values,
    where,
)


def hint(origin: Origin) -> str | None:
    outputs = values(origin, "outputs")
    if origin.phase == "backward" or origin.kind != "inf" or not is_half(outputs):
        return None
    largest = max_abs(operands(origin))
    if largest >= FLOAT16_MAX:
        return None
    scaler, autocast = scaler_and_autocast(origin)
    start = (
        f"{where(origin)} overflowed float16 (largest finite value 65,504) although its inputs "
        f"were finite (largest |input| {largest:.3g}); float32 would be fine. "
    )
    if autocast:
        used = "autocast and a GradScaler" if scaler else "autocast"
        return start + (
            f"Your script already uses {used}; autocast ran this op in {autocast}. Run "
            "this op in float32 (with torch.autocast(device_type, enabled=False): "
            "op(x.float())), use bfloat16 as the autocast dtype (float32's range), or keep "
            "its inputs smaller (normalise before it). A loss scaler cannot help: this is "
            "the forward."
        )
    return start + (
        "Run this part in float32, use bfloat16, or use autocast (which keeps "
        "overflow-prone ops in float32)"
        + (" with GradScaler." if not scaler else "; your GradScaler already scales the loss.")
    )
