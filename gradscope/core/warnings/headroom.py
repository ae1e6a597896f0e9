"""Headroom: how far a value sits from a limit it must not cross, on the scale where the
detectors compare (the log of a magnitude: a factor; an exp input as it is: a difference).
Less than ``LOW`` (a factor of four) is low: float16 activations beyond 16,376, an exp input
in float16 beyond 9.7, or a magnitude within four times the smallest normal number."""

import math

LOW = math.log(4.0)


def overflow_headroom(value: float, limit: float) -> float:
    """``limit - value`` on the comparison scale; positive while below the limit."""
    return limit - value


def is_low(headroom: float) -> bool:
    return math.isfinite(headroom) and headroom < LOW
