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
