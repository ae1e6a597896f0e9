"""Evidence: an exponential op went Inf and its largest input (recorded) is above log of
its dtype's maximum: exp(142) overflows float32, whose exp stops at 88.7 (11.1 in float16)."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, dtype_of, exp_limit, max_abs, values, where

EXPONENTIALS = {"exp", "exp2", "expm1", "sinh", "cosh"}


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or origin.kind != "inf":
        return None
    if base_op(origin.op) not in EXPONENTIALS:
        return None
    inputs = values(origin, "inputs")
    dtype = dtype_of(inputs) or dtype_of(values(origin, "outputs"))
    limit = exp_limit(dtype) if dtype else None
    largest = max_abs(inputs)
    if limit is None or largest <= limit:
        return None
    wider = exp_limit("float32") or limit
    in_float32 = (
        f" float32 would be fine (its limit is {wider:.3g}): run this part in float32."
        if dtype in ("float16", "bfloat16") and largest <= wider
        else ""
    )
    return (
        f"{where(origin)} overflowed: its largest input is {largest:.3g}, and exp of anything "
        f"above {limit:.3g} is Inf in {dtype}. Subtract the maximum before exp (the usual "
        "fix: the logsumexp trick; torch.softmax, log_softmax and logsumexp do it), compute it "
        "in log space, or "
        f"clamp the input (x.clamp_max({limit * 0.9:.3g}))." + in_float32
    )
