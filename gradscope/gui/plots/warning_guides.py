"""An early warning drawn on the plot of its quantity: the limit it must not reach as a
horizontal line, and the engine's projection (from the warned value to the limit at
``steps_left`` steps) as a dotted line. The plot shows one warning's guides at a time: the
selected layer's, else the latest warning of a ticked layer, up to the step on show."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from gradscope.core.facts import EarlyWarning
from gradscope.gui.status_style import WARNING_LIMIT_COLOR, format_value

# The warned quantity (EarlyWarning.quantity, gradscope.core.warnings.observations) -> the
# history's statistic that plots it (the forward statistics out_max_abs and out_log_partition
# the warnings add, and the built-in max |g|). The loss and the gradient norm are whole-model
# quantities with no per-layer plot.
QUANTITY_STATISTICS = {
    "output max |x|": "out_max_abs",
    "log-partition": "out_log_partition",
    "max |g|": "max_abs",
}


def guiding_warning(
    warnings: Sequence[EarlyWarning],
    statistic: str,
    layers: Collection[str],
    selected_layer: str | None,
    step: int | None,
) -> EarlyWarning | None:
    """The warning whose guides the plot of ``statistic`` draws: of the ticked ``layers``,
    with a limit, at or before ``step``; the selected layer's when it has one."""
    found = [
        warning
        for warning in warnings
        if QUANTITY_STATISTICS.get(warning.quantity) == statistic
        and warning.module in layers
        and warning.limit is not None
        and (step is None or warning.step <= step)
    ]
    own = [warning for warning in found if warning.module == selected_layer]
    return (own or found or [None])[-1]


class WarningGuides:
    """The limit line and the dotted projection of one warning, added to ``item`` once."""

    def __init__(self, item: pg.PlotItem) -> None:
        pen = pg.mkPen(WARNING_LIMIT_COLOR, width=1.5, style=Qt.PenStyle.DashLine)
        self.limit_line = pg.InfiniteLine(
            angle=0,
            movable=False,
            pen=pen,
            label="",
            labelOpts={"position": 0.02, "color": WARNING_LIMIT_COLOR, "anchors": [(0, 0), (0, 0)]},
        )
        self.limit_line.setZValue(15)
        self.limit_line.setVisible(False)
        item.addItem(self.limit_line, ignoreBounds=True)
        self.projection = pg.PlotDataItem(
            pen=pg.mkPen(WARNING_LIMIT_COLOR, width=2, style=Qt.PenStyle.DotLine)
        )
        self.projection.setZValue(15)
        self.projection.setVisible(False)
        item.addItem(self.projection)
        # An unseen point at the limit: an infinite line takes no part in the auto-range,
        # and a limit out of view would not be drawn at all.
        self.anchor = pg.ScatterPlotItem(size=1, pen=None, brush=None)
        item.addItem(self.anchor)
        self.shown: EarlyWarning | None = None

    def refresh(
        self,
        warning: EarlyWarning | None,
        to_y: Callable[[np.ndarray], np.ndarray],
        x: float = 0.0,
        project: bool = True,
    ) -> None:
        """Draw ``warning``'s guides (None: hide them). ``to_y`` maps values to the drawn
        y (log10 on a log axis); ``x`` is where the warning's step is drawn. ``project``:
        draw the projection, ``steps_left`` steps on (not on a wall-clock axis, where a
        step not taken yet has no time).'"""
        limit = warning.limit if warning is not None else None
        drawn = None
        if warning is not None and limit is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                drawn = to_y(np.array([warning.value, limit], dtype=np.float64))
            if not np.isfinite(drawn).all():
                drawn = None  # a value a log axis cannot show (<= 0)
        self.shown = warning if drawn is not None else None
        if warning is None or drawn is None:
            self.limit_line.setVisible(False)
            self.projection.setVisible(False)
            self.anchor.setData([])
            return
        self.limit_line.setValue(float(drawn[1]))
        where = warning.module or "(model root)"
        steps_left = warning.steps_left
        # The step axis shows the run's steps only, so a projection reaching past the last
        # one is cut at the edge: the label says where it ends.
        reached = (
            f", reached at step ~{warning.step + steps_left} at this rate"
            if steps_left is not None
            else ""
        )
        self.limit_line.label.setFormat(
            f"limit {format_value(limit)} ({where} {warning.kind}{reached})"
        )
        self.limit_line.setVisible(True)
        if project and steps_left is not None:
            self.projection.setData([x, x + steps_left], [drawn[0], drawn[1]])
            self.projection.setVisible(True)
        else:
            self.projection.setVisible(False)
        self.anchor.setData([x], [drawn[1]])
