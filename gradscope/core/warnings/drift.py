"""A drift: a sustained growth, on a scale where steady exponential growth is a straight line
(the log of a magnitude; an exp input as it is). The slope is the Theil-Sen estimate over the
last ``WINDOW`` samples (the median of the pairwise slopes: robust to a few outliers), and
it counts as sustained when most pairwise slopes are positive and the last third of the
window still climbs at least half as fast as the whole: training's usual early rise
flattens, a drift does not."""

import functools
import math
from dataclasses import dataclass

import numpy as np

WINDOW = 24
RECENT = WINDOW // 3
SUSTAINED = 0.75  # the share of pairwise slopes that must be positive
NOT_SLOWING = 0.5  # the recent slope, as a share of the window's
# A limit further ahead than this many window spans, at the rate seen, is not projected: a
# fit over 24 samples says little about where the quantity is ten windows later.
EXTRAPOLATION = 3.0
# The growth over the window that makes a drift: towards a limit within the horizon, any
# four-fold, and with no limit in sight four-fold too, once past the baseline.
MIN_RISE_TO_LIMIT = math.log(4.0)
MIN_RISE = math.log(4.0)
# A quantity's first samples are its baseline, not a drift: early in training every layer's
# outputs grow while the model leaves its initialisation. A drift is judged once the window
# has this many samples of history before it.
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


def find_drift(
    steps: np.ndarray, values: np.ndarray, limit: float | None, *, towards_limit: bool = False
) -> Drift | None:
    """A drift in the last ``WINDOW`` samples of ``values`` (taken at ``steps``), towards
    ``limit`` (same scale; None: no limit), or None. ``towards_limit``: only a drift that
    reaches the limit within the projection counts (an exp input, a log-partition: rising
    some nats is what learning does)."""
    if len(values) < WINDOW + BASELINE:
        return None
    steps = steps[-WINDOW:].astype(float)
    values = values[-WINDOW:]
    if not np.isfinite(values).all():
        return None
    slope, rising = _theil_sen(steps, values)
    if slope <= 0 or rising < SUSTAINED:
        return None
    recent, _ = _theil_sen(steps[-RECENT:], values[-RECENT:])
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
    return Drift(slope, int(steps[0]), first_value, current, steps_left)
