"""The heatmap's colours: viridis over log10 ‖grad‖, and the cells outside that scale
(0, not watched, NaN/Inf, overflowed on a skipped step)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from gradscope.core.history import MISSING
from gradscope.gui.mixed_precision import (
    SKIPPED_COLOR,
)
from gradscope.gui.plots.display_values import log10_display

MISSING_RGBA = (200, 200, 200, 255)
NONFINITE_RGBA = (214, 39, 40, 255)
# A heatmap cell whose gradient overflowed on a step the loss scaler skipped: expected, so
# not the NaN/Inf red (the scaler's purple). Below MISSING, so any measured value wins a block.
SKIPPED_CELL = -2.0
SKIPPED_RGBA = (*pg.mkColor(SKIPPED_COLOR).getRgb()[:3], 255)
# An exact zero gradient is not a small one: white, outside the colour scale (its lowest
# colour would read as "small but flowing").
ZERO_RGBA = (255, 255, 255, 255)
VIRIDIS = pg.colormap.get("viridis")
VIRIDIS_LUT = VIRIDIS.getLookupTable(0.0, 1.0, 256, alpha=True)


def colorize(matrix: np.ndarray, low: float, high: float) -> np.ndarray:
    """RGBA of heatmap cells: viridis over log10 in [low, high], white for 0, grey for
    MISSING, red for NaN/Inf."""
    lut = VIRIDIS_LUT
    logged = log10_display(matrix)
    scaled = np.clip((np.nan_to_num(logged, nan=low) - low) / (high - low), 0, 1)
    rgba = lut[(scaled * 255).astype(np.intp)]
    rgba[matrix == 0] = ZERO_RGBA
    rgba[matrix == MISSING] = MISSING_RGBA
    rgba[matrix == SKIPPED_CELL] = SKIPPED_RGBA
    rgba[~np.isfinite(matrix)] = NONFINITE_RGBA
    return rgba


def mark_skipped(block: np.ndarray, skipped: np.ndarray) -> np.ndarray:
    """``block`` (steps x layers) with the non-finite values of skipped steps replaced by
    SKIPPED_CELL (a copy, only when there are any)."""
    if not skipped.any():
        return block
    overflowed = ~np.isfinite(block) & skipped[:, None]
    return np.where(overflowed, np.float32(SKIPPED_CELL), block) if overflowed.any() else block
