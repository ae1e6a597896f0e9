"""Values as drawn: log10 of the positive finite ones, steps reduced to blocks for the
heatmap (NaN/Inf win a block), the log range of what is shown."""

from __future__ import annotations

import math

import numpy as np

from gradscope.core.history import MISSING

HEATMAP_MAX_COLUMNS = 2000


def log10_display(values: np.ndarray) -> np.ndarray:
    """log10 of positive finite values for drawing; everything else NaN (drawn separately)."""
    values = np.asarray(values, dtype=np.float64)
    out = np.full(values.shape, np.nan)
    good = np.isfinite(values) & (values > 0)
    out[good] = np.log10(values[good])
    return out


def reduce_steps(matrix: np.ndarray, limit: int = HEATMAP_MAX_COLUMNS) -> tuple[np.ndarray, int]:
    """At most ``limit`` rows of a steps x layers matrix for drawing: each row is the largest
    value of a block of steps. NaN and Inf win a block (max propagates them), so a
    non-finite step never disappears; MISSING (-1) loses to any measured value."""
    steps = len(matrix)
    per_row = max(1, math.ceil(steps / limit))
    if per_row == 1:
        return matrix, 1
    padding = (-steps) % per_row
    padded = np.concatenate(
        [matrix, np.full((padding, matrix.shape[1]), MISSING, dtype=matrix.dtype)]
    )
    return padded.reshape(-1, per_row, matrix.shape[1]).max(axis=1), per_row


def finite_log_range(matrix: np.ndarray, low_high: tuple[float, float]) -> tuple[float, float]:
    """The smallest and largest log10 of the positive finite values, merged with
    ``low_high``."""
    good = matrix[np.isfinite(matrix) & (matrix > 0)]
    if not good.size:
        return low_high
    low, high = low_high
    return min(low, math.log10(float(good.min()))), max(high, math.log10(float(good.max())))


def ema_display(values: np.ndarray, weight: float) -> np.ndarray:
    """The smoothing slider's curve, as TensorBoard draws it: a debiased exponential moving
    average of the finite values in order (``weight`` 0 gives them back unchanged, towards 1
    smoother); NaN where the value is not finite, so a gap or a marker stays where it was.
    A view of drawn values, not a statistic: the raw values are drawn faint behind it."""
    values = np.asarray(values, dtype=np.float64)
    out = np.full(values.shape, np.nan)
    finite = np.isfinite(values)
    series = values[finite]
    if not series.size or weight <= 0:
        out[finite] = series
        return out
    weight = min(float(weight), 0.999)
    # In blocks short enough that weight ** -length stays far inside float64's range: within
    # a block, s_t = w^(t+1) s_(-1) + (1 - w) sum_k w^(t-k) x_k.
    length = max(1, min(len(series), int(100 / -math.log10(weight))))
    smoothed = np.empty_like(series)
    carried = 0.0
    for start in range(0, len(series), length):
        block = series[start : start + length]
        powers = weight ** np.arange(len(block), dtype=np.float64)
        sums = np.cumsum(block / powers) * powers * (1 - weight)
        smoothed[start : start + len(block)] = weight * powers * carried + sums
        carried = smoothed[start + len(block) - 1]
    # Debiased: the average starts at 0, so the first values are divided by what their
    # weights add up to.
    smoothed /= 1 - weight ** np.arange(1, len(series) + 1, dtype=np.float64)
    out[finite] = smoothed
    return out
