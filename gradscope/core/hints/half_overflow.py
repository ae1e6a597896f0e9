"""Evidence: the op's output is float16/bfloat16 and Inf, while its largest |input| is
below float16's maximum (65,504): the result overflowed half precision only."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import FLOAT16_MAX, is_half, max_abs, values, where


def hint(origin: Origin) -> str | None:
    inputs, outputs = values(origin, "inputs"), values(origin, "outputs")
    if origin.phase == "backward" or origin.kind != "inf" or not is_half(outputs):
        return None
    largest = max_abs(inputs)
    if largest >= FLOAT16_MAX:
        return None
    return (
        f"{where(origin)} overflowed float16 (largest finite value 65,504) although its inputs "
        f"were finite (largest |input| {largest:.3g}); float32 would be fine. Run this part in "
        "float32, use bfloat16, or use autocast (which keeps overflow-prone ops in float32) "
        "with GradScaler."
    )
