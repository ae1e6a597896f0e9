"""Evidence: a sqrt/rsqrt whose input minimum is below 0: the root of a negative number is
NaN. When the same input also holds values large enough that the negative one is within a
few units of its dtype's rounding, the negative is rounding noise; otherwise the recorded
values cannot tell rounding from a sign error, and the hint gives the test for each."""

from __future__ import annotations

import torch

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, dtype_of, fmt, max_abs, min_input, values, where


def hint(origin: Origin) -> str | None:
    low = min_input(origin)
    if origin.phase == "backward" or base_op(origin.op) not in ("sqrt", "rsqrt"):
        return None
    if low is None or low >= 0:
        return None
    inputs = values(origin, "inputs")
    dtype = dtype_of(inputs) or "float32"
    kind = getattr(torch, dtype, torch.float32)
    precision = torch.finfo(kind).eps if kind.is_floating_point else 0.0
    if abs(low) <= 16 * precision * max_abs(inputs):
        return (
            f"{where(origin)} got a negative input (minimum {fmt(low)}), within {dtype}'s "
            f"rounding of 0 for values up to {max_abs(inputs):.3g}: a quantity that is >= 0 in "
            "exact arithmetic came out slightly negative. Clamp it at 0 and keep the root's "
            "gradient finite (x.clamp_min(1e-12))."
        )
    return (
        f"{where(origin)} got a negative input (minimum {fmt(low)}), which gives NaN. If the "
        "input is >= 0 in exact arithmetic (a difference of nearly equal terms, 1 - |u|^2 of "
        "a unit vector) and only rounding made it negative, clamp it (x.clamp_min(1e-12), "
        "which also keeps the gradient finite). If it can be truly negative (a sign error, "
        "a missing square or softplus), make it non-negative by construction: a clamp would "
        "hide the error. Comparing the magnitude of its terms with this minimum tells which."
    )
