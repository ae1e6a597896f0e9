"""Evidence: a division made NaN/Inf and what it divided by (recorded from its arguments,
also when it is an integer tensor or a Python number that the float tensors do not show)
is whole numbers >= 0 holding a 0: a count (``mask.sum()``, the number of valid tokens)
that is 0 for this batch, so the mean is 0/0."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.backward_divide_by_zero import DIVISIONS
from gradscope.core.hints.values import base_op, evidence, where


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or base_op(origin.op) not in DIVISIONS:
        return None
    denominator = evidence(origin, "denominator") or {}
    if not denominator.get("zeros") or not denominator.get("whole"):
        return None
    dtype = denominator.get("dtype", "")
    if denominator.get("source") == "python number":
        integer = isinstance(denominator.get("value"), int)
    else:
        integer = not dtype.startswith(("float", "bfloat"))
    if not integer:
        return None  # a float 0.0 may be a std or a norm: not surely a count
    what = f"an {dtype} tensor of whole numbers" if dtype else "the Python int 0"
    made = "0/0 (NaN)" if origin.kind == "nan" else "x/0 (Inf)"
    return (
        f"{where(origin)} divided by a count that is 0 for this batch ({what}, minimum 0: "
        f"mask.sum(), a number of valid items), so the mean is {made}: nothing in this batch "
        "was counted. Usual fix: divide by count.clamp(min=1), which gives 0 with a zero "
        "gradient for an empty batch and changes nothing otherwise; or skip the batch (if "
        "count == 0: continue). Do not add an epsilon to the count: whenever the numerator "
        "is not exactly 0, the loss becomes 1/eps (1e8 for 1e-8) times too large."
    )
