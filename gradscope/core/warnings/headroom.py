"""Headroom: how far a value sits from a limit it must not cross, on the scale where the
detectors compare (the log of a magnitude: a factor; an exp input as it is: a difference).
Less than ``LOW`` (a factor of four) is low: float16 activations beyond 16,376, an exp input
in float16 beyond 9.7, or a magnitude within four times the smallest normal number.

A fixed margin is too narrow for a quantity that jumps about: an exp input that swings by
1.8 between steps crosses float16's 11.09 from 7.6 in two steps, with no drift to see. So the
room to the overflow is also weighed against the quantity's own swings: it is low when it is
less than ``SWING_TIMES`` times the largest rise between two consecutive samples among its
last ``SWING_SAMPLES`` (at least ``SWING_MIN`` of them). Exp inputs only (the exponent scale:
additive rises): a magnitude's rises are factors, and outputs that grow 10-30x a step from
their small initial values early in a healthy run (nanoGPT's projections in float16) would
warn from a fixed distance of float16's 65,504 that they never come near."""

import math

import numpy as np

LOW = math.log(4.0)
SWING_SAMPLES = 16
SWING_MIN = 8
SWING_TIMES = 2.0
# Exp inputs with more room than this are not looked at for swings (float32's limit is
# 88.7): no rise between two samples is taken to be larger.
SWING_CAP = SWING_TIMES * 7.0


def overflow_headroom(value: float, limit: float) -> float:
    """``limit - value`` on the comparison scale; positive while below the limit."""
    return limit - value


def is_low(headroom: float) -> bool:
    return math.isfinite(headroom) and headroom < LOW


def largest_rise(values: np.ndarray) -> np.ndarray:
    """Per column of ``values`` (samples oldest first, shape (samples, columns); NaN where a
    column has fewer), the largest rise between two consecutive samples; NaN where it has
    fewer than ``SWING_MIN`` samples or never rose."""
    rises = np.diff(values, axis=0)
    with np.errstate(invalid="ignore"):
        rises[~(rises > 0)] = np.nan
        found = np.fmax.reduce(rises, axis=0)
    found[np.isfinite(values).sum(axis=0) < SWING_MIN] = np.nan
    return found


def swings_over(room: float, rise: float) -> bool:
    """Whether ``SWING_TIMES`` rises of ``rise`` cross a limit ``room`` away."""
    return math.isfinite(room) and math.isfinite(rise) and room < SWING_TIMES * rise
