"""Evidence: a conversion to float16 (``.half()``, ``.to(torch.float16)``, ``.type(...)``)
made Inf from finite values whose largest magnitude (recorded) is above float16's maximum,
65,504: the value did not fit the dtype it was converted to. No arithmetic overflowed."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import (
    FLOAT16_MAX,
    base_op,
    dtype_of,
    max_abs,
    operands,
    values,
    where,
)

CASTS = {"half", "to", "type", "_to_copy", "type_as"}


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or origin.kind != "inf" or base_op(origin.op) not in CASTS:
        return None
    if dtype_of(values(origin, "outputs")) != "float16":
        return None
    largest = max_abs(operands(origin))
    if largest < FLOAT16_MAX:
        return None
    return (
        f"{where(origin)} converted values up to {largest:.3g} to float16, whose largest "
        "finite value is 65,504: they became Inf. Nothing overflowed in arithmetic; the "
        "tensor does not fit float16. Keep it in float32 (autocast leaves such inputs and "
        "reductions in float32), or bring it into range before the cast (normalise or "
        "rescale it); bfloat16 holds float32's range if the precision is enough."
    )
