"""Evidence: a power op (``pow``, ``**``, ``float_power``) made NaN in the forward, its
exponent (a Python number among its arguments) is not a whole number, and its base's
recorded minimum is below 0: a negative number to a fractional power is NaN."""

from __future__ import annotations

import math

from gradscope.core.facts import Origin
from gradscope.core.hints.values import argument, base_op, fmt, min_input, where

POWERS = {"pow", "__pow__", "float_power"}


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or origin.kind != "nan" or base_op(origin.op) not in POWERS:
        return None
    exponent = argument(origin, "exponent", "arg1")
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        return None
    low = min_input(origin)
    if not math.isfinite(exponent) or float(exponent).is_integer() or low is None or low >= 0:
        return None
    root = "x ** 0.5 is sqrt(x)" if exponent == 0.5 else f"x ** {exponent:g} takes a root of x"
    return (
        f"{where(origin)} raised negative numbers (base minimum {fmt(low)}) to the fractional "
        f"power {exponent:g}: {root}, and a negative number to a non-integer power is NaN. "
        "The base is not the positive quantity the code assumes (a variance, a scale, a "
        "distance computed with a sign error, or data outside the range a transform "
        "expects). Make it positive by construction (softplus, exp, a square); where values "
        "below 0 are only rounding noise, clamp to a small positive floor (x.clamp_min(1e-6))"
        + (", not to 0: 0 to a negative power is Inf." if exponent < 0 else ".")
    )
