"""A spike: a value far above the running median of its own history, in robust units (the
median absolute deviation), and at least twice that median. The history is the quantity's
values of the last ``SPAN`` steps, on a scale where growth is additive (the log of a
magnitude): a quantity seen every step has 64 of them; one seen every 10th step too few
(``MIN_HISTORY``) to judge a spike by, since over hundreds of steps a healthy layer's outputs
grow smoothly, which a median and a small spread of old samples would take for a spike."""

import math
from dataclasses import dataclass

import numpy as np

# Enough history that a median means something; few false alarms over hundreds of layers.
MIN_HISTORY = 20
SPAN = 64  # steps
THRESHOLD = 10.0
MIN_RISE = math.log(2.0)
# The MAD of normal data is 0.6745 of its standard deviation: z-scores comparable to usual ones.
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Spike:
    z: float
    median: float


def recent_history(steps: np.ndarray, values: np.ndarray, step: int) -> np.ndarray | None:
    """The history a spike at ``step`` is judged against: the values of the last ``SPAN``
    steps, or None when the series is sampled more sparsely now than in that history (the
    early warnings' forward statistics go from every step to every ``detail_every``th at
    the end of their dense start: a median of the dense samples from tens of steps ago
    would take a healthy layer's smooth growth over the gap for a spike)."""
    recent = steps >= step - SPAN
    steps, values = steps[recent], values[recent]
    if len(values) < MIN_HISTORY:
        return None
    gaps = np.diff(steps)
    if step - steps[-1] > 2 * float(np.median(gaps)):
        return None
    return values


def find_spike(history: np.ndarray, value: float) -> Spike | None:
    """A spike of ``value`` against ``history`` (same scale), or None."""
    if len(history) < MIN_HISTORY or not math.isfinite(value):
        return None
    median = float(np.median(history))
    rise = value - median
    if rise < MIN_RISE:
        return None
    spread = _MAD_TO_SIGMA * float(np.median(np.abs(history - median)))
    z = rise / spread if spread > 0 else math.inf
    return Spike(z, median) if z >= THRESHOLD else None
