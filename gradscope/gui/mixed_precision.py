"""Mixed precision in the plots: the steps the loss scaler skipped (an expected overflow, not
a failure: their own purple diamond, never the NaN/Inf cross) and the loss scale (a log axis
on the right of the loss plot, shown only for a run with a scaler). The engine says which
steps were skipped and what the scale was (``RunHistory.skipped``, ``RunHistory.loss_scale``);
nothing here computes either."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from gradscope.core.history import RunHistory
from gradscope.core.watch import STATUS_NONFINITE, STATUS_SKIPPED
from gradscope.gui.status_style import STATUS_COLORS, format_value

SKIPPED_COLOR = STATUS_COLORS[STATUS_SKIPPED]
SKIPPED_WORDS = "skipped by the loss scaler"
SKIPPED_SYMBOL = "d"
LOSS_SCALE_COLOR = "#7b4fa8"


def skipped_rows(history: RunHistory, start: int = 0, stop: int | None = None) -> np.ndarray:
    """A bool per row of ``start:stop``: the scaler skipped that step as designed. A skipped
    step that is also a failure (a scale collapse, a non-finite loss: the engine keeps its
    layers' status NaN/Inf) is not one of these; it is shown as the failure it is."""
    stop = history.count if stop is None else stop
    rows = history.skipped[start:stop].copy()
    marked = np.flatnonzero(rows)
    if len(marked):
        statuses = history.status_matrix()[start + marked]
        rows[marked[(statuses == STATUS_NONFINITE).any(axis=1)]] = False
    return rows


def has_scaler(history: RunHistory) -> bool:
    return bool(history.count and (history.loss_scale[: history.count] > 0).any())


def _tip(x: float, y: float, data: object) -> str:
    # data: (step, scale); x is the step only on a step axis (not on a wall-clock one).
    step, value = data if isinstance(data, tuple) else (round(x), data)
    scale = f" (loss scale {format_value(float(value))})" if value else ""
    return f"step {step}: {SKIPPED_WORDS}{scale}\nan expected overflow, not a failure"


def skipped_marker_item(size: int = 11) -> pg.ScatterPlotItem:
    item = pg.ScatterPlotItem(
        size=size,
        symbol=SKIPPED_SYMBOL,
        pxMode=True,
        brush=pg.mkBrush(SKIPPED_COLOR),
        pen=pg.mkPen("w", width=1),
        hoverable=True,
        tip=_tip,
    )
    item.setZValue(19)
    return item


class SkippedMarkers:
    """Purple diamonds on a plot at the skipped steps: pinned to the top edge (the gradient
    norms of an overflowed step are not a value on the axis), or on the curve at ``y``."""

    def __init__(self, item: pg.PlotItem, *, pinned: bool) -> None:
        self.plot_item = item
        self.pinned = pinned
        self.markers = skipped_marker_item()
        item.addItem(self.markers, ignoreBounds=True)
        self.steps = np.zeros(0)  # the skipped steps' numbers
        self.x = np.zeros(0)  # and where they are drawn (steps, or seconds on a time axis)
        self._y = np.zeros(0)
        self._scales = np.zeros(0)
        item.vb.sigRangeChanged.connect(self.place)
        item.vb.sigResized.connect(self.place)

    def refresh(
        self, history: RunHistory, y: np.ndarray | None = None, x: np.ndarray | None = None
    ) -> None:
        """``x``: where each step of the history is drawn (None: at its step number)."""
        rows = skipped_rows(history)
        self.steps = history.steps[: history.count][rows].astype(np.float64)
        self.x = self.steps if x is None else np.asarray(x, dtype=np.float64)[rows]
        self._scales = history.loss_scale[: history.count][rows]
        if y is not None:
            self._y = np.asarray(y, dtype=np.float64)[rows]
        self.place()

    def place(self, *_: object) -> None:
        if not len(self.steps):
            self.markers.setData([])
            return
        (_, _), (_, top) = self.plot_item.vb.viewRange()
        _, pixel_height = self.plot_item.vb.viewPixelSize()
        pinned = np.full(len(self.steps), top - 8 * pixel_height)
        y = (
            pinned
            if self.pinned or len(self._y) != len(self.steps)
            else np.where(np.isfinite(self._y), self._y, pinned)
        )
        data = list(zip(self.steps.astype(np.int64).tolist(), self._scales.tolist(), strict=True))
        self.markers.setData(x=self.x, y=y, data=data)


class LossScaleAxis:
    """The loss scale on a right-hand log axis of ``item`` (the loss plot), sharing its step
    axis; hidden while the run has no scaler."""

    def __init__(self, item: pg.PlotItem) -> None:
        self.plot_item = item
        self.view = pg.ViewBox(enableMenu=False)
        self.view.setMouseEnabled(x=False, y=False)
        item.scene().addItem(self.view)
        self.axis = item.getAxis("right")
        self.axis.linkToView(self.view)
        self.axis.setLogMode(True)
        self.axis.setLabel("loss scale", color=LOSS_SCALE_COLOR)
        self.axis.setTextPen(pg.mkPen(LOSS_SCALE_COLOR))
        self.view.setXLink(item.vb)
        self.curve = pg.PlotDataItem(
            pen=pg.mkPen(LOSS_SCALE_COLOR, width=1.5, style=Qt.PenStyle.DashLine),
            stepMode=None,
            connect="finite",
        )
        self.view.addItem(self.curve)
        self.shown = False
        item.vb.sigResized.connect(self._sync_geometry)
        item.hideAxis("right")

    def _sync_geometry(self, *_: object) -> None:
        self.view.setGeometry(self.plot_item.vb.sceneBoundingRect())
        self.view.linkedViewChanged(self.plot_item.vb, self.view.XAxis)

    def refresh(self, history: RunHistory, x: np.ndarray | None = None) -> None:
        """``x``: where each step is drawn (None: at its step number)."""
        shown = has_scaler(history)
        if shown != self.shown:
            self.shown = shown
            if shown:
                self.plot_item.showAxis("right")
                self.axis.linkToView(self.view)
            else:
                self.plot_item.hideAxis("right")
            self.view.setVisible(shown)
        if not shown:
            self.curve.setData([])
            return
        count = history.count
        scale = history.loss_scale[:count]
        steps = history.steps[:count].astype(np.float64) if x is None else x[:count]
        logged = np.full(count, np.nan)
        good = scale > 0
        logged[good] = np.log10(scale[good])
        self.curve.setData(steps, logged, connect="finite")
        self._sync_geometry()


class PrecisionSummary:
    """The status bar's words for a run with a loss scaler: the scale now and the skipped
    steps, counted apart from the failures (NaN/Inf steps); empty without a scaler. Counts
    only the rows added since the last call (a 30 Hz redraw of a long run stays cheap)."""

    def __init__(self) -> None:
        self._history: RunHistory | None = None
        self._rows = 0
        self._skipped = 0
        self._failures = 0

    def text(self, history: RunHistory) -> tuple[str, str]:
        if not has_scaler(history):
            return "", ""
        count = history.count
        if history is not self._history or count < self._rows:
            self._history, self._rows, self._skipped, self._failures = history, 0, 0, 0
        if count > self._rows:
            statuses = history.status_matrix()[self._rows : count]
            self._failures += int((statuses == STATUS_NONFINITE).any(axis=1).sum())
            self._skipped += int(skipped_rows(history, self._rows, count).sum())
            self._rows = count
        skipped, failures = self._skipped, self._failures
        scale = float(history.loss_scale[count - 1])
        text = f"loss scale {format_value(scale)} · {skipped} skipped · {failures} NaN/Inf"
        tip = (
            f"{skipped} step(s) {SKIPPED_WORDS} (an overflow it expects: the update is "
            "skipped and the scale halved; not a failure)\n"
            f"{failures} step(s) with a real NaN/Inf (a non-finite loss or forward, or a "
            "loss scale collapse)"
        )
        return text, tip
