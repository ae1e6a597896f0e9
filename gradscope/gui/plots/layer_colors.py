"""One colour per layer, kept across plots."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QColor

# Distinct colours for the first layers, without the status red and orange (those mean
# NaN/Inf and exploding everywhere in the app); later layers cycle through hues.
_LAYER_PALETTE = (
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#393b79",
    "#637939",
)


def layer_color(position: int) -> QColor:
    if position < len(_LAYER_PALETTE):
        return QColor(_LAYER_PALETTE[position])
    return pg.intColor(position, hues=13, values=2, maxValue=220, minValue=140)
