"""A drift: a sustained growth, on a scale where steady exponential growth is a straight line
(the log of a magnitude; an exp input as it is). The slope is the Theil-Sen estimate over the
window (the median of the pairwise slopes: robust to a few outliers), and it counts as
sustained when most pairwise slopes are positive and the last third of the window still
climbs at least half as fast as the whole: training's usual early rise flattens, a drift does
not.

The window is counted in steps, so that sparse samples suffice: the samples of the last
``WINDOW`` steps (all ``WINDOW`` of them for a quantity seen at every step), but never fewer
than ``MIN_WINDOW`` samples (a quantity seen every 10th step: its last 8 samples, 70 steps).
It is judged once ``BASELINE`` steps of history come before it."""

import functools
import math
from dataclasses import dataclass

import numpy as np

WINDOW = 24  # steps, and the most samples a window holds
MIN_WINDOW = 8  # the fewest samples a window holds
SUSTAINED = 0.75  # the share of pairwise slopes that must be positive
NOT_SLOWING = 0.5  # the recent slope, as a share of the window's
# A limit further ahead than this many window spans, at the rate seen, is not projected: a
# fit over 24 samples says little about where the quantity is ten windows later.
EXTRAPOLATION = 3.0
# The growth over the window that makes a drift: towards a limit within the horizon, any
# four-fold, and with no limit in sight four-fold too, once past the baseline.
MIN_RISE_TO_LIMIT = math.log(4.0)
MIN_RISE = math.log(4.0)
# A quantity's first steps are its baseline, not a drift: early in training every layer's
# outputs grow while the model leaves its initialisation. A drift is judged once the window
# starts this many steps after the quantity's first sample.
BASELINE = WINDOW
# The smallest spread of a window's values that could hold a drift (a quick test before the fit).
MIN_SPREAD = min(MIN_RISE, MIN_RISE_TO_LIMIT) / 2


@dataclass(frozen=True)
class Drift:
    slope: float  # per step, on the drift's scale
    first_step: int
    first_value: float  # fitted, on the drift's scale
    current: float  # fitted at the last step, on the drift's scale
    steps_left: int | None  # to the limit at this slope; None when too far to project


@functools.cache
def _pairs(count: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(count, 1)


def _theil_sen(steps: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    first, second = _pairs(len(steps))
    slopes = (values[second] - values[first]) / (steps[second] - steps[first])
    return float(np.median(slopes)), float((slopes > 0).mean())


def window_size(steps: np.ndarray) -> int:
    """How many of the last samples (taken at ``steps``, oldest first) make the window."""
    within = len(steps) - int(np.searchsorted(steps, steps[-1] - WINDOW, side="right"))
    return max(MIN_WINDOW, min(WINDOW, within))


def find_drift(
    steps: np.ndarray,
    values: np.ndarray,
    limit: float | None,
    *,
    towards_limit: bool = False,
    peak_before: float = -math.inf,
) -> Drift | None:
    """A drift in the window of ``values`` (taken at ``steps``, oldest first: the
    quantity's kept history), towards ``limit`` (same scale; None: no limit), or None.
    ``towards_limit``: only a drift that reaches the limit within the projection counts
    (an exp input, a log-partition: rising some nats is what learning does).
    ``peak_before``: the highest value before the kept history's last ``WINDOW`` samples;
    the drift must climb beyond it and beyond every kept value before the window (a
    quantity coming back to where it was is not drifting)."""
    if len(values) <= MIN_WINDOW:
        return None
    size = window_size(steps)
    if len(values) <= size or steps[-size] - steps[0] < BASELINE:
        return None
    before = values[-WINDOW:-size]
    if len(before):
        peak_before = max(peak_before, float(before.max()))
    steps = steps[-size:].astype(float)
    values = values[-size:]
    if not np.isfinite(values).all():
        return None
    slope, rising = _theil_sen(steps, values)
    if slope <= 0 or rising < SUSTAINED:
        return None
    recent_count = max(2, size // 3)
    recent, _ = _theil_sen(steps[-recent_count:], values[-recent_count:])
    if recent < NOT_SLOWING * slope:
        return None
    intercept = float(np.median(values - slope * steps))
    current = intercept + slope * steps[-1]
    first_value = intercept + slope * steps[0]
    rise = current - first_value
    steps_left = None
    if limit is not None and math.isfinite(limit):
        ahead = (limit - current) / slope
        if ahead <= EXTRAPOLATION * (steps[-1] - steps[0]):
            steps_left = max(0, round(ahead))
    if steps_left is None and towards_limit:
        return None
    if rise < (MIN_RISE_TO_LIMIT if steps_left is not None else MIN_RISE):
        return None
    if current <= peak_before:
        return None
    return Drift(slope, int(steps[0]), first_value, current, steps_left)
