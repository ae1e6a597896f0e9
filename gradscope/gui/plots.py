"""The four plots, drawn from the engine's RunHistory (they never compute a statistic).

(1) gradient norm against step, one curve per ticked layer, log y; non-finite points are
markers pinned to the top edge and exact zeros to the bottom edge, so nothing is dropped by
the logarithm; (2) the loss; (3) a layers x steps heatmap of log10 gradient norm with NaN/Inf
in red; (4) gradient flow: one bar per layer at the selected step, coloured by status, with
the thresholds. Curves are created once per layer and then only fed with ``setData``.
Clicking any plot emits ``selection_made`` (layer and/or step); the window links them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyqtgraph as pg
import pyqtgraph.exporters
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics
from PySide6.QtWidgets import QSplitter, QToolTip, QVBoxLayout, QWidget

from gradscope.core.history import MISSING, STATUS_MISSING, RunHistory
from gradscope.core.watch import classify
from gradscope.gui.mixed_precision import (
    SKIPPED_COLOR,
    SKIPPED_WORDS,
    LossScaleAxis,
    SkippedMarkers,
    skipped_rows,
)
from gradscope.gui.peak_raster import PeakRasterItem
from gradscope.gui.plot_axes import GridAxis, LayerAxis, elide
from gradscope.gui.selection import Selection
from gradscope.gui.status_style import (
    NONFINITE_MARKER_COLOR,
    STATUS_COLORS,
    ZERO_MARKER_COLOR,
    format_value,
)

_HOVER_PIXELS = 9
_LEGEND_MAX = 8  # entries: with more layers, the selected and the first ones, then "+N more"
HEATMAP_MAX_COLUMNS = 2000
_DOTS_UP_TO = 40
# More ticked layers than this: one connect-array curve per colour instead of one per layer.
_GROUPED_ABOVE = 40
_EDGE_LEGEND = "\x00edge"
_LEFT_AXIS_WIDTH = 64
_MISSING_COLOR = (200, 200, 200, 255)
_NONFINITE_RGBA = (214, 39, 40, 255)
# A heatmap cell whose gradient overflowed on a step the loss scaler skipped: expected, so
# not the NaN/Inf red (the scaler's purple). Below MISSING, so any measured value wins a block.
SKIPPED_CELL = -2.0
_SKIPPED_RGBA = (*pg.mkColor(SKIPPED_COLOR).getRgb()[:3], 255)
# An exact zero gradient is not a small one: white, outside the colour scale (its lowest
# colour would read as "small but flowing").
ZERO_RGBA = (255, 255, 255, 255)
# The layer-name axis of the heatmap (and the gradient-norm plot's, kept as wide so that
# their step axes line up) grows with the names, within these bounds.
_MAX_LEFT_AXIS_WIDTH = 170
_VIRIDIS = pg.colormap.get("viridis")
_VIRIDIS_LUT = _VIRIDIS.getLookupTable(0.0, 1.0, 256, alpha=True)


def _without_broken_svg_export() -> None:
    """Take pyqtgraph's SVG exporter out of its export dialog (right-click > Export...): in
    pyqtgraph 0.14 under Qt 6.12 it fails on every plot (it parses path data in a form this
    Qt no longer writes; pyqtgraph issue #3485). File > Export plots as SVG renders the plots
    through Qt's own QSvgGenerator instead."""
    exporters = pg.exporters.Exporter.Exporters
    if pg.exporters.SVGExporter in exporters:
        exporters.remove(pg.exporters.SVGExporter)


_without_broken_svg_export()


@dataclass
class PlotView:
    """What the plots show: the history, layers in forward order, the ticked ones and the
    current selection."""

    history: RunHistory
    order: list[str]
    visible: set[str]
    selected_layer: str | None = None
    selected_step: int | None = None
    explode_threshold: float = 1000.0
    vanish_threshold: float = 1e-7
    colors: dict[str, QColor] = field(default_factory=dict)
    # While a traced backward pass is walked: each layer's gradient norm so far (layers not
    # reached yet are absent), shown by the gradient-flow chart instead of the step's row.
    flow: dict[str, float] | None = None
    flow_title: str | None = None
    # Steps are arriving (a run is going on).
    live: bool = False


def classify_for_display(value: float, view: PlotView) -> int:
    """A trace value's status colour, with the engine's rule (watch.classify)."""
    if value == MISSING:
        return STATUS_MISSING
    return int(classify(np.array([value]), np.zeros(1), view.explode_threshold,
                        view.vanish_threshold)[0])


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
    padded = np.concatenate([matrix, np.full((padding, matrix.shape[1]), MISSING,
                                             dtype=matrix.dtype)])
    return padded.reshape(-1, per_row, matrix.shape[1]).max(axis=1), per_row


def _finite_log_range(matrix: np.ndarray, low_high: tuple[float, float]) -> tuple[float, float]:
    """The smallest and largest log10 of the positive finite values, merged with
    ``low_high``."""
    good = matrix[np.isfinite(matrix) & (matrix > 0)]
    if not good.size:
        return low_high
    low, high = low_high
    return min(low, math.log10(float(good.min()))), max(high, math.log10(float(good.max())))


def _colorize(matrix: np.ndarray, low: float, high: float) -> np.ndarray:
    """RGBA of heatmap cells: viridis over log10 in [low, high], white for 0, grey for
    MISSING, red for NaN/Inf."""
    lut = _VIRIDIS_LUT
    logged = log10_display(matrix)
    scaled = np.clip((np.nan_to_num(logged, nan=low) - low) / (high - low), 0, 1)
    rgba = lut[(scaled * 255).astype(np.intp)]
    rgba[matrix == 0] = ZERO_RGBA
    rgba[matrix == MISSING] = _MISSING_COLOR
    rgba[matrix == SKIPPED_CELL] = _SKIPPED_RGBA
    rgba[~np.isfinite(matrix)] = _NONFINITE_RGBA
    return rgba


def _mark_skipped(block: np.ndarray, skipped: np.ndarray) -> np.ndarray:
    """``block`` (steps x layers) with the non-finite values of skipped steps replaced by
    SKIPPED_CELL (a copy, only when there are any)."""
    if not skipped.any():
        return block
    overflowed = ~np.isfinite(block) & skipped[:, None]
    return np.where(overflowed, np.float32(SKIPPED_CELL), block) if overflowed.any() else block


# Distinct colours for the first layers, without the status red and orange (those mean
# NaN/Inf and exploding everywhere in the app); later layers cycle through hues.
_LAYER_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                  "#bcbd22", "#7f7f7f", "#393b79", "#637939")


def layer_color(position: int) -> QColor:
    if position < len(_LAYER_PALETTE):
        return QColor(_LAYER_PALETTE[position])
    return pg.intColor(position, hues=13, values=2, maxValue=220, minValue=140)


def _round_up_to_nice(value: float) -> float:
    """The smallest of 1, 2 or 5 times a power of ten that is at least ``value`` (>= 1)."""
    if value <= 1:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


_STATUS_BRUSHES: dict[int, QBrush] = {}


def _status_brush(status: int) -> QBrush:
    brush = _STATUS_BRUSHES.get(status)
    if brush is None:
        brush = _STATUS_BRUSHES[status] = pg.mkBrush(STATUS_COLORS.get(status, "#7f7f7f"))
    return brush


def _plot_widget(
    title: str, grid_x: bool = True, grid_y: bool = True, left: GridAxis | None = None
) -> pg.PlotWidget:
    axes = {"left": left or GridAxis("left"), "bottom": GridAxis("bottom")}
    widget = pg.PlotWidget(axisItems=axes)
    widget.setTitle(title, size="10pt")
    item = widget.getPlotItem()
    item.showGrid(x=grid_x, y=grid_y, alpha=0.15)
    item.hideButtons()
    for axis in axes.values():
        axis.enableAutoSIPrefix(False)
        axis.place_behind_data()
    widget.setMinimumSize(200, 150)
    return widget


class _LogNormCache:
    """The gradient-norm plot's own copy of log10 ‖grad‖ as drawn (NaN where a marker shows
    the value instead), one contiguous row per history column, extended with the new steps
    only; with the edge points (non-finite or zero) found so far. A history that went back
    (rewound, replaced) is read afresh."""

    def __init__(self) -> None:
        self.history: RunHistory | None = None
        self.rows = 0
        self.columns = 0
        self.values = np.zeros((0, 0), dtype=np.float32)  # columns x step capacity
        self.steps = np.zeros(0)
        self.edge_rows = np.zeros(0, dtype=np.intp)
        self.edge_columns = np.zeros(0, dtype=np.intp)
        self.edge_values = np.zeros(0)
        self.generation = 0  # changes whenever anything above does
        self.resets = 0  # changes when earlier rows were replaced
        self._last: tuple[np.ndarray, int] | None = None

    def _still_valid(self, history: RunHistory, matrix: np.ndarray) -> bool:
        if history is not self.history or len(matrix) < self.rows:
            return False
        if not self.rows or self._last is None:
            return True
        row, step = self._last
        return (int(history.steps[self.rows - 1]) == step
                and np.array_equal(matrix[self.rows - 1, : len(row)], row, equal_nan=True))

    def update(self, history: RunHistory) -> bool:
        """Take the steps added since the last call; True when anything changed."""
        matrix = history.matrix("grad_norm")
        count, columns = matrix.shape
        if not self._still_valid(history, matrix):
            self.history = history
            self.rows = self.columns = 0
            self.edge_rows = np.zeros(0, dtype=np.intp)
            self.edge_columns = np.zeros(0, dtype=np.intp)
            self.edge_values = np.zeros(0)
            self.resets += 1
            self.generation += 1
        if count == self.rows and columns == self.columns:
            return False
        capacity_columns, capacity_rows = self.values.shape
        if columns > capacity_columns or count > capacity_rows:
            grown = np.full((max(columns, capacity_columns),
                             max(count, 2 * capacity_rows, 64)), np.nan, dtype=np.float32)
            grown[: self.columns, : self.rows] = self.values[: self.columns, : self.rows]
            self.values = grown
            steps = np.zeros(grown.shape[1])
            steps[: self.rows] = self.steps[: self.rows]
            self.steps = steps
        # Columns added later hold MISSING in earlier rows, i.e. NaN here (the buffer's fill).
        self.values[self.columns: columns, : self.rows] = np.nan
        new = matrix[self.rows: count]
        self.values[:columns, self.rows: count] = log10_display(new).T
        self.steps[self.rows: count] = history.steps[self.rows: count]
        # An overflow on a step the loss scaler skipped is expected: no NaN/Inf marker (the
        # skipped step has its own).
        skipped = skipped_rows(history, self.rows, count)[:, None]
        edge_rows, edge_columns = np.nonzero((~np.isfinite(new) & ~skipped) | (new == 0))
        if len(edge_rows):
            self.edge_rows = np.concatenate([self.edge_rows, edge_rows + self.rows])
            self.edge_columns = np.concatenate([self.edge_columns, edge_columns])
            self.edge_values = np.concatenate(
                [self.edge_values, new[edge_rows, edge_columns].astype(np.float64)])
        self.rows, self.columns = count, columns
        if count:
            self._last = (matrix[count - 1].copy(), int(history.steps[count - 1]))
        self.generation += 1
        return True


class _PeakCache:
    """Per-layer minimum and maximum of each block of ``per_block`` steps (peak
    downsampling; NaN wins a block so that a gap never closes), for all complete blocks,
    extended as steps arrive. With a ``finer`` level (half the block size) that is up to
    date, blocks are made from pairs of its blocks instead of from the steps: reading a
    fraction of the data."""

    def __init__(self, per_block: int) -> None:
        self.per_block = per_block
        self.resets = -1
        self.blocks = 0
        self.low = np.zeros((0, 0), dtype=np.float32)
        self.high = np.zeros((0, 0), dtype=np.float32)

    def update(self, cache: _LogNormCache, finer: _PeakCache | None = None) -> None:
        per_block = self.per_block
        if cache.resets != self.resets or self.low.shape[0] < cache.columns:
            self.resets, self.blocks = cache.resets, 0
            self.low = np.zeros((cache.columns, 0), dtype=np.float32)
            self.high = self.low
        complete = cache.rows // per_block
        if complete <= self.blocks:
            return
        if complete > self.low.shape[1]:
            capacity = max(complete, 2 * self.low.shape[1])
            for name in ("low", "high"):
                grown = np.empty((cache.columns, capacity), dtype=np.float32)
                grown[:, : self.blocks] = getattr(self, name)[: cache.columns, : self.blocks]
                setattr(self, name, grown)
        columns, start = cache.columns, self.blocks
        if (finer is not None and finer.per_block * 2 == per_block
                and finer.resets == cache.resets and finer.blocks >= 2 * complete
                and finer.low.shape[0] >= columns):
            pairs = slice(2 * start, 2 * complete)
            for name, reduce in (("low", np.minimum), ("high", np.maximum)):
                halves = getattr(finer, name)[:columns, pairs]
                getattr(self, name)[:, start:complete] = reduce(halves[:, 0::2], halves[:, 1::2])
        else:
            segment = cache.values[:columns, start * per_block: complete * per_block]
            segment = segment.reshape(columns, complete - start, per_block)
            self.low[:, start:complete] = segment.min(axis=2)
            self.high[:, start:complete] = segment.max(axis=2)
        self.blocks = complete


class _PeakLevels:
    """Peak caches at power-of-two block sizes, kept as the user zooms: going back to a
    zoom level costs nothing, and a coarser level is made from a finer one."""

    def __init__(self) -> None:
        self.levels: dict[int, _PeakCache] = {}

    @staticmethod
    def block_size(steps_per_pixel: float) -> int:
        """The power of two at or above ``steps_per_pixel`` (at most two points a pixel)."""
        return 1 << max(0, math.ceil(math.log2(max(steps_per_pixel, 1.0))))

    def level(self, cache: _LogNormCache, per_block: int) -> _PeakCache:
        level = self.levels.get(per_block)
        if level is None:
            level = self.levels[per_block] = _PeakCache(per_block)
        finer = self.levels.get(per_block // 2)
        if finer is not None:
            finer.update(cache, self.levels.get(per_block // 4))
        level.update(cache, finer)
        return level


class GradientNormPlot(QWidget):
    selection_made = Signal(object)  # Selection

    def __init__(self) -> None:
        super().__init__()
        self.widget = _plot_widget("Gradient norm per layer")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self.item = self.widget.getPlotItem()
        self.item.setLabel("left", "‖grad‖")
        self.item.setLabel("bottom", "step")
        self.item.getAxis("left").setLogMode(True)
        self.item.getAxis("left").setWidth(_LEFT_AXIS_WIDTH)
        self.item.setClipToView(True)
        self.item.setDownsampling(ds=True, auto=True, mode="peak")
        # Under the step axis, not over the curves (it hid the data), in columns.
        self.legend = pg.LegendItem(labelTextSize="8pt", colCount=1, verSpacing=-6)
        self.item.layout.addItem(self.legend, 4, 1)
        self._legend_names: list[str] = []
        self._legend_more = pg.PlotDataItem(pen=None)  # the sample of the "+N more" entry
        # One curve per layer while few are ticked; with more, the unselected ones are
        # peak-downsampled to the view here and drawn together as one image (each layer in
        # its colour), and only the selected layer keeps its own curve.
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.group_lines = PeakRasterItem()
        self.group_lines.setVisible(False)
        # While there are few steps, the grouped layers' points as dots (one step has no
        # line to draw).
        self.group_dots = pg.ScatterPlotItem(size=4, pen=None)
        self.group_dots.setVisible(False)
        self.grouped = False
        self.cache = _LogNormCache()
        self._peaks = _PeakLevels()
        self._history: RunHistory | None = None
        self._columns = np.zeros(0, dtype=np.intp)  # history columns of the ticked layers
        self._names: list[str] = []  # layer name of each history column
        self._colors: dict[str, QColor] = {}
        self._curve_state: dict[str, tuple[int, bool]] = {}
        self._group_key: tuple | None = None
        self._group_color_cache: tuple | None = None  # see _group_colors
        self._selected: str | None = None
        self._hold = False  # the panel is moving the view: draw once, afterwards
        self._steps = np.zeros(0)
        self._visible: list[str] = []
        self._edge_key: tuple | None = None
        self._edges: tuple[np.ndarray, np.ndarray, list, list, list, list] | None = None
        self._edge_points: list[tuple[str, int, float]] = []  # layer, step, value
        self.markers = pg.ScatterPlotItem(size=13, pxMode=True, symbol="x",
                                          brush=pg.mkBrush(NONFINITE_MARKER_COLOR),
                                          pen=pg.mkPen(NONFINITE_MARKER_COLOR, width=2.5))
        self.markers.setZValue(20)
        self.item.addItem(self.markers, ignoreBounds=True)
        self.skipped = SkippedMarkers(self.item, pinned=True)
        self.item.vb.addItem(self.group_lines)
        self.item.vb.addItem(self.group_dots)
        self._marker_brushes = (pg.mkBrush(ZERO_MARKER_COLOR), pg.mkBrush(NONFINITE_MARKER_COLOR))
        self._marker_pens = (pg.mkPen(ZERO_MARKER_COLOR, width=1),
                             pg.mkPen(NONFINITE_MARKER_COLOR, width=1),
                             pg.mkPen(NONFINITE_MARKER_COLOR, width=2.5))
        self.step_line = pg.InfiniteLine(
            angle=90, pen=pg.mkPen("#555", width=1, style=Qt.PenStyle.DashLine))
        self.step_line.setVisible(False)
        self.item.addItem(self.step_line, ignoreBounds=True)
        self.hover = pg.TextItem(anchor=(0, 1), color="#111", fill=pg.mkBrush(255, 255, 230, 235),
                                 border=pg.mkPen("#999"))
        self.hover.setZValue(50)
        self.hover.setVisible(False)
        self.item.addItem(self.hover, ignoreBounds=True)
        self.hover_text = ""
        self.item.vb.sigRangeChanged.connect(self._on_view_range_changed)
        self.item.vb.sigResized.connect(self._on_view_range_changed)
        scene = self.widget.scene()
        scene.sigMouseMoved.connect(self._on_scene_mouse_moved)
        scene.sigMouseClicked.connect(self._on_scene_mouse_clicked)

    # -- drawing -------------------------------------------------------------------------
    def refresh(self, view: PlotView) -> None:
        history = view.history
        self._history = history
        self._colors = view.colors
        cache = self.cache
        cache.update(history)
        rows = cache.rows
        self._steps = cache.steps[:rows]
        self._names = list(history.layer_names)
        visible = [name for name in view.order if name in view.visible and history.has_layer(name)]
        self._columns = np.fromiter((history.column(n) for n in visible), dtype=np.intp,
                                    count=len(visible))
        self._visible = visible
        grouped = len(visible) > _GROUPED_ABOVE
        if grouped != self.grouped:
            self.grouped = grouped
            self._curve_state.clear()
            self._group_key = None
        shown = set(visible)
        self.group_dots.setVisible(grouped)
        self.group_lines.setVisible(grouped)
        if grouped:
            for name, curve in self.curves.items():
                if name != view.selected_layer or name not in shown:
                    curve.setVisible(False)
                    self._curve_state.pop(name, None)
        else:
            for name in view.order:
                if history.has_layer(name):
                    self._update_layer_curve(name, name in shown)
        for name, curve in self.curves.items():
            if not history.has_layer(name):
                curve.setVisible(False)
                self._curve_state.pop(name, None)
        self._update_edges()
        self.skipped.refresh(history)
        self._update_legend(visible)
        self.show_selection(view.selected_layer, view.selected_step)
        self._redraw_view_dependent()

    def _layer_curve(self, name: str) -> pg.PlotDataItem:
        curve = self.curves.get(name)
        if curve is None:
            color = self._colors.get(name, QColor("#1f77b4"))
            curve = pg.PlotDataItem(name=name or "(model)", connect="finite",
                                     autoDownsampleFactor=1.0)
            curve.setPen(pg.mkPen(color, width=1))
            self.item.addItem(curve)
            self.curves[name] = curve
        return curve

    def _update_layer_curve(self, name: str, shown: bool) -> None:
        """Give one layer's curve its data (views of the cache) if it changed."""
        curve = self._layer_curve(name)
        curve.setVisible(shown)
        if not shown:
            self._curve_state.pop(name, None)
            return
        cache = self.cache
        state = (cache.generation, name == self._selected)
        if self._curve_state.get(name) == state:
            return
        self._curve_state[name] = state
        logged = cache.values[self._history.column(name), : cache.rows]
        few = cache.rows <= _DOTS_UP_TO and bool(np.isfinite(logged).any())
        color = self._colors.get(name, QColor("#1f77b4"))
        curve.setData(self._steps, logged, connect="finite", symbol="o" if few else None,
                      symbolSize=4, symbolBrush=color, symbolPen=None)

    def resizeEvent(self, event: object) -> None:
        super().resizeEvent(event)
        self._fit_legend_columns()

    def _on_view_range_changed(self, *_: object) -> None:
        self._fit_legend_columns()
        if not self._hold:
            self._redraw_view_dependent()

    def _fit_legend_columns(self) -> None:
        # As many columns as the plot's width holds: a legend wider than the plot would
        # widen the whole plot past its view (the right part cut off).
        font = QFont()
        font.setPointSize(8)
        metrics = QFontMetrics(font)
        widest = max((metrics.horizontalAdvance(label.text) + 34
                      for _, label in self.legend.items), default=150)
        # The view's width, not the plot item's: a legend too wide has already widened that.
        available = self.widget.viewport().width() - self.item.getAxis("left").width() - 16
        columns = max(1, int(available // max(widest, 60)))
        if columns != self.legend.columnCount:
            self.legend.setColumnCount(columns)

    def hold(self, holding: bool) -> None:
        """While the panel moves the view for a refresh, draw nothing (the refresh does)."""
        self._hold = holding

    def _redraw_view_dependent(self) -> None:
        if self.grouped:
            self._update_groups()
        self._place_markers()

    def _update_groups(self) -> None:
        """The unselected ticked layers, clipped to the view and peak-downsampled to at
        most one block of steps per pixel column, drawn together (see PeakRasterItem)."""
        cache = self.cache
        rows = cache.rows
        vb = self.item.vb
        (x0, x1), _ = vb.viewRange()
        steps = cache.steps[:rows]
        first = max(0, int(np.searchsorted(steps, x0, side="left")) - 1)
        last = min(rows, int(np.searchsorted(steps, x1, side="right")) + 1)
        per_block = _PeakLevels.block_size((last - first) / max(vb.width(), 1.0))
        key = (cache.generation, self._columns.tobytes(), first, last, per_block)
        if key == self._group_key:
            return
        self._group_key = key
        columns = self._columns
        if per_block == 1:
            x = steps[first:last]
            low = high = cache.values[columns, first:last]
        else:
            peaks = self._peaks.level(cache, per_block)
            start = first // per_block
            stop = min(peaks.blocks, -(-last // per_block))
            low = peaks.low[columns, start:stop]
            high = peaks.high[columns, start:stop]
            x = steps[start * per_block: stop * per_block: per_block]
            tail = rows - peaks.blocks * per_block
            if last > peaks.blocks * per_block and tail:  # the incomplete last block
                rest = cache.values[columns, peaks.blocks * per_block: rows]
                low = np.concatenate([low, rest.min(axis=1, keepdims=True)], axis=1)
                high = np.concatenate([high, rest.max(axis=1, keepdims=True)], axis=1)
                x = np.append(x, steps[peaks.blocks * per_block])
        color_index, colors = self._group_colors()
        self.group_lines.set_data(x, low, high, color_index, colors)
        if rows <= _DOTS_UP_TO:  # few steps (one has no line): a dot for each value too
            finite = np.isfinite(low)
            layer, point = np.nonzero(finite)
            brushes = [pg.mkBrush(color) for color in colors]
            self.group_dots.setData(x=x[point], y=low[finite],
                                    brush=[brushes[i - 1] for i in color_index[layer].tolist()])
        else:
            self.group_dots.setData([])

    def _group_colors(self) -> tuple[np.ndarray, list[QColor]]:
        """One colour index per ticked layer, in the order the colours first appear (a later
        one is drawn over an earlier one where lines cross), and the colours; kept while the
        ticked layers and the colours stay (a zoom asks again)."""
        key = (self._columns.tobytes(), self._names)
        kept = self._group_color_cache
        if kept is not None and kept[0] == key and kept[1] is self._colors:
            return kept[2], kept[3]
        index_of: dict[int, int] = {}
        colors: list[QColor] = []
        color_index = np.zeros(len(self._columns), dtype=np.uint16)
        for position, column in enumerate(self._columns.tolist()):
            color = self._colors.get(self._names[column], QColor("#1f77b4"))
            index = index_of.get(color.rgba())
            if index is None:
                colors.append(color)
                index = index_of[color.rgba()] = len(colors)
            color_index[position] = index
        self._group_color_cache = (key, self._colors, color_index, colors)
        return color_index, colors

    def _update_edges(self) -> None:
        """Markers data for the ticked layers' non-finite and zero values."""
        cache = self.cache
        key = (cache.generation, self._columns.tobytes())
        if key == self._edge_key:
            return
        self._edge_key = key
        ticked = np.zeros(max(cache.columns, 1), dtype=bool)
        ticked[self._columns] = True
        keep = ticked[cache.edge_columns]
        rows = cache.edge_rows[keep]
        columns = cache.edge_columns[keep]
        values = cache.edge_values[keep]
        steps = cache.steps[rows]
        # Markers of several layers at one step and edge sit on the same spot: keep one per
        # step and kind (NaN, Inf, zero), so a long run of zeros in hundreds of layers stays
        # a few thousand points, not millions.
        kind = np.where(np.isnan(values), 2, (values != 0).astype(np.int64))
        _, first = np.unique(steps.astype(np.int64) * 3 + kind, return_index=True)
        first.sort()
        columns, steps, values = columns[first], steps[first], values[first]
        top = values != 0
        nan = np.isnan(values)
        symbols = np.where(nan, "x", np.where(top, "t1", "t")).tolist()
        brushes = [self._marker_brushes[t] for t in top.tolist()]
        pens = [self._marker_pens[2 if n else int(t)] for n, t in zip(nan.tolist(), top.tolist(),
                                                                       strict=True)]
        names = self._names
        data = [(names[c], int(s), float(v))
                for c, s, v in zip(columns.tolist(), steps.tolist(), values.tolist(), strict=True)]
        self._edges = (steps, top, symbols, brushes, pens, data)
        self._edge_points = data

    def _update_legend(self, visible: list[str]) -> None:
        # Many layers: the selected one and the first others, then how many more (hovering
        # a curve names it); the legend no longer disappears.
        shown = list(visible)
        more = 0
        if len(shown) > _LEGEND_MAX:
            first = [self._selected] if self._selected in shown else []
            shown = first + [n for n in shown if n not in first][: _LEGEND_MAX - 1 - len(first)]
            more = len(visible) - len(shown)
        if self._edge_points:
            shown = [*shown, _EDGE_LEGEND]
        skipped = bool(len(self.skipped.steps))
        key = [*shown, more, skipped]
        if key == self._legend_names:
            return
        self.legend.clear()
        for name in shown:
            if name != _EDGE_LEGEND:
                # A sample item of the layer's colour, not its curve: with many layers the
                # curves are grouped, and a layer's own curve must not be made for it.
                sample = pg.PlotDataItem(pen=pg.mkPen(self._colors.get(name, QColor("#1f77b4")),
                                                      width=1.5))
                self.legend.addItem(sample, elide(name, 22))
        if more:
            self.legend.addItem(self._legend_more, f"+{more} more")
        if _EDGE_LEGEND in shown:
            self.legend.addItem(self.markers, "NaN/Inf top, 0 bottom")
        if skipped:
            self.legend.addItem(self.skipped.markers, SKIPPED_WORDS)
        self._legend_names = key
        self.legend.setVisible(bool(shown) or skipped)
        self._fit_legend_columns()

    def show_selection(self, layer: str | None, step: int | None) -> None:
        previous, self._selected = self._selected, layer
        for name in {previous, layer}:
            curve = self.curves.get(name) if name is not None else None
            if curve is None and not (self.grouped and name == layer and name in self._visible):
                continue
            curve = self._layer_curve(name)
            color = pg.mkPen(curve.opts["pen"]).color()
            # Qt strokes antialiased pens wider than 1 px very slowly (seconds for a
            # 10,000-point curve), so only the one highlighted curve is wide, and not
            # antialiased.
            selected = name == layer
            curve.setPen(pg.mkPen(color, width=2.6 if selected else 1))
            curve.opts["antialias"] = not selected
            curve.curve.opts["antialias"] = not selected
            curve.setZValue(10 if selected else 0)
            if self.grouped:
                # Over the grouped curves, only the selected layer has a curve of its own.
                if selected and name in self._visible:
                    self._update_layer_curve(name, True)
                else:
                    curve.setVisible(False)
                    self._curve_state.pop(name, None)
        self.step_line.setVisible(step is not None)
        if step is not None:
            self.step_line.setValue(step)

    def _place_markers(self, *_: object) -> None:
        if not self._edge_points or self._edges is None:
            self.markers.setData([])
            return
        (_, _), (bottom, top) = self.item.vb.viewRange()
        _, pixel_height = self.item.vb.viewPixelSize()
        steps, at_top, symbols, brushes, pens, data = self._edges
        y = np.where(at_top, top - 8 * pixel_height, bottom + 8 * pixel_height)
        self.markers.setData(x=steps, y=y, symbol=symbols, brush=brushes, pen=pens, data=data)

    # -- hover and click -----------------------------------------------------------------
    def nearest(self, scene_pos: QPointF) -> tuple[str, int, float] | None:
        """The drawn point (layer, step, value) within a few pixels of ``scene_pos``."""
        vb = self.item.vb
        if not vb.sceneBoundingRect().contains(scene_pos) or not len(self._steps):
            return None
        point = vb.mapSceneToView(scene_pos)
        pixel_width, pixel_height = vb.viewPixelSize()
        best: tuple[float, tuple[str, int, float]] | None = None
        for spot in self.markers.points():
            pos = spot.pos()
            dx = (pos.x() - point.x()) / pixel_width
            dy = (pos.y() - point.y()) / pixel_height
            distance = math.hypot(dx, dy)
            if distance <= _HOVER_PIXELS and (best is None or distance < best[0]):
                best = (distance, spot.data())
        row = int(np.argmin(np.abs(self._steps - point.x())))
        dx = (self._steps[row] - point.x()) / pixel_width
        if abs(dx) <= _HOVER_PIXELS * 3 and len(self._columns) and self._history is not None:
            ys = self.cache.values[self._columns, row].astype(np.float64)
            distances = np.hypot(dx, (ys - point.y()) / pixel_height)
            distances[~np.isfinite(distances)] = np.inf
            i = int(np.argmin(distances))
            distance = float(distances[i])
            if distance <= _HOVER_PIXELS * 1.5 and (best is None or distance < best[0]):
                column = int(self._columns[i])
                value = float(self._history.matrix("grad_norm")[row, column])
                best = (distance, (self._names[column], int(self._steps[row]), value))
        return best[1] if best else None

    def clear(self) -> None:
        for curve in self.curves.values():
            self.item.removeItem(curve)
        self.curves.clear()
        self.group_lines.set_data(np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0)),
                                  np.zeros(0), [])
        self.group_dots.setData([])
        self._curve_state.clear()
        self._group_key = self._edge_key = None
        self._selected = None
        self._legend_names = ["-"]

    def _on_scene_mouse_moved(self, scene_pos: QPointF) -> None:
        found = self.nearest(scene_pos)
        if found is None:
            self.hover.setVisible(False)
            self.hover_text = ""
            return
        name, step, value = found
        self.hover_text = f"{name or '(model)'}\nstep {step}\n‖grad‖ = {format_value(value)}"
        self.hover.setText(self.hover_text)
        # On the side of the cursor where the label has room: below it in the upper part
        # of the plot, left of it in the right part (it was clipped at the top and right).
        rect = self.item.vb.sceneBoundingRect()
        right = scene_pos.x() > rect.left() + rect.width() * 0.6
        upper = scene_pos.y() < rect.top() + rect.height() * 0.4
        self.hover.setAnchor((1 if right else 0, 0 if upper else 1))
        self.hover.setPos(self.item.vb.mapSceneToView(scene_pos))
        self.hover.setVisible(True)

    def _on_scene_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        scene_pos = event.scenePos()
        if not self.item.vb.sceneBoundingRect().contains(scene_pos):
            return
        found = self.nearest(scene_pos)
        if found is not None:
            self.selection_made.emit(Selection(found[0], found[1]))
        elif len(self._steps):
            x = self.item.vb.mapSceneToView(scene_pos).x()
            row = int(np.argmin(np.abs(self._steps - x)))
            self.selection_made.emit(Selection(None, int(self._steps[row])))


class LossPlot(QWidget):
    selection_made = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.widget = _plot_widget("Loss")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self.item = self.widget.getPlotItem()
        self.item.setLabel("bottom", "step")
        self.item.getAxis("left").setWidth(56)
        self.item.setClipToView(True)
        self.item.setDownsampling(ds=True, auto=True, mode="peak")
        self.curve = pg.PlotDataItem(pen=pg.mkPen("#333", width=1), connect="finite")
        self.item.addItem(self.curve)
        self.markers = pg.ScatterPlotItem(size=11, symbol="x",
                                          pen=pg.mkPen(NONFINITE_MARKER_COLOR, width=2.5))
        self.item.addItem(self.markers, ignoreBounds=True)
        self.skipped = SkippedMarkers(self.item, pinned=False)
        self.loss_scale = LossScaleAxis(self.item)
        # Under the step axis, only while there is a scaler to explain.
        self.legend = pg.LegendItem(labelTextSize="8pt", colCount=1, verSpacing=-6)
        self.item.layout.addItem(self.legend, 4, 1)
        self.legend.setVisible(False)
        self._legend_key: tuple[bool, bool] = (False, False)
        self.step_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#555", style=Qt.PenStyle.DashLine))
        self.step_line.setVisible(False)
        self.item.addItem(self.step_line, ignoreBounds=True)
        self._nonfinite_steps = np.zeros(0)
        self._log = False
        self.item.vb.sigRangeChanged.connect(self._place_markers)
        self.widget.scene().sigMouseClicked.connect(self._on_scene_mouse_clicked)
        self._steps = np.zeros(0)

    def refresh(self, view: PlotView) -> None:
        steps = view.history.steps.astype(np.float64)
        loss = view.history.losses
        finite = np.isfinite(loss)
        # Log scale only when the loss spans orders of magnitude (a narrow range would get
        # one or two ticks).
        positive = loss[finite]
        use_log = bool(positive.size and (positive > 0).all()
                       and positive.max() / positive.min() >= 20)
        if use_log != self._log:
            self._log = use_log
            self.item.getAxis("left").setLogMode(use_log)
            self.item.setLabel("left", "loss" + (" (log)" if use_log else ""))
        y = log10_display(loss) if use_log else np.where(finite, loss, np.nan)
        # Dots while there are few steps: a single step has no line to draw.
        few = len(steps) <= _DOTS_UP_TO and bool(np.isfinite(y).any())
        self.curve.setData(steps, y, connect="finite", symbol="o" if few else None,
                           symbolSize=5, symbolBrush="#333", symbolPen=None)
        self._steps = steps
        self._nonfinite_steps = steps[~finite]
        self.skipped.refresh(view.history, y)
        self.loss_scale.refresh(view.history)
        self._update_legend()
        self.show_selection(view.selected_step)
        self._place_markers()

    def _update_legend(self) -> None:
        key = (bool(len(self.skipped.steps)), self.loss_scale.shown)
        if key == self._legend_key:
            return
        self._legend_key = key
        self.legend.clear()
        if key[0]:
            self.legend.addItem(self.skipped.markers, SKIPPED_WORDS)
        if key[1]:
            self.legend.addItem(self.loss_scale.curve, "loss scale (right, log)")
        self.legend.setVisible(any(key))

    def show_selection(self, step: int | None) -> None:
        self.step_line.setVisible(step is not None)
        if step is not None:
            self.step_line.setValue(step)

    def _place_markers(self, *_: object) -> None:
        if not len(self._nonfinite_steps):
            self.markers.setData([])
            return
        (_, _), (_, top) = self.item.vb.viewRange()
        _, pixel_height = self.item.vb.viewPixelSize()
        self.markers.setData(self._nonfinite_steps, np.full(len(self._nonfinite_steps),
                                                            top - 8 * pixel_height))

    def _on_scene_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton or not len(self._steps):
            return
        if not self.item.vb.sceneBoundingRect().contains(event.scenePos()):
            return
        x = self.item.vb.mapSceneToView(event.scenePos()).x()
        row = int(np.argmin(np.abs(self._steps - x)))
        self.selection_made.emit(Selection(None, int(self._steps[row])))


class HeatmapPlot(QWidget):
    """Layers (rows, forward order, top to bottom) by steps, coloured by log10 ‖grad‖."""

    selection_made = Signal(object)

    def __init__(self, cache: _LogNormCache | None = None) -> None:
        super().__init__()
        # Tells when the history went back (then everything is drawn afresh).
        self.cache = cache if cache is not None else _LogNormCache()
        self._key: tuple | None = None
        self._count = 0
        self._blocks = 0
        self._low_high = (math.inf, -math.inf)
        self._colored_levels: tuple[float, float] | None = None
        self._colored_rows = 0
        self._shown = np.zeros((0, 0), dtype=np.float32)
        self._rgba = np.zeros((0, 0, 4), dtype=np.uint8)
        self._skipped_title = False
        self.axis = LayerAxis("left")
        self.widget = _plot_widget(
            "log10 ‖grad‖ (red: NaN/Inf, white: 0)",
            grid_x=False, grid_y=False, left=self.axis)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self.item = self.widget.getPlotItem()
        self.item.setLabel("bottom", "step")
        self.axis.setWidth(_LEFT_AXIS_WIDTH)
        self.item.vb.invertY(True)
        self.image = pg.ImageItem(axisOrder="col-major")
        self.item.addItem(self.image)
        # Horizontal, under the step axis: the heatmap keeps the same width as the gradient
        # norm plot above it, so their linked step axes line up.
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=_VIRIDIS, interactive=False,
                                        width=10, orientation="horizontal")
        self.colorbar.setColorMap(_VIRIDIS)
        self.item.layout.addItem(self.colorbar, 4, 1)
        pen = pg.mkPen("#000", width=1, style=Qt.PenStyle.DashLine)
        self.step_line = pg.InfiniteLine(angle=90, pen=pen)
        self.layer_line = pg.InfiniteLine(angle=0, pen=pen)
        for line in (self.step_line, self.layer_line):
            line.setVisible(False)
            self.item.addItem(line, ignoreBounds=True)
        self._order: list[str] = []
        self._matrix = np.zeros((0, 0), dtype=np.float32)
        self.steps_per_column = 1
        self._steps = np.zeros(0)
        self.levels = (0.0, 1.0)
        self.rgba = np.zeros((0, 0, 4), dtype=np.uint8)
        scene = self.widget.scene()
        scene.sigMouseClicked.connect(self._on_scene_mouse_clicked)
        scene.sigMouseMoved.connect(self._on_scene_mouse_moved)

    def refresh(self, view: PlotView) -> None:
        history = view.history
        order = [name for name in view.order if history.has_layer(name)]
        self._order = order
        if self.axis.names != order:
            self.axis.names = order
            self.axis.picture = None
            self.axis.update()
        if not order or history.count == 0:
            self.image.clear()
            self._key = None
            return
        cache = self.cache
        cache.update(history)
        count = history.count
        columns = np.fromiter((history.column(name) for name in order), dtype=np.intp,
                              count=len(order))
        per_row = max(1, math.ceil(count / HEATMAP_MAX_COLUMNS))
        key = (cache.resets, columns.tobytes(), per_row)
        if key != self._key:
            # Blocks of steps change with the number of steps (at most HEATMAP_MAX_COLUMNS
            # columns), or the layers changed: start over.
            self._key = key
            self._blocks = 0
            self._low_high = (math.inf, -math.inf)
            self._colored_levels = None
            self._colored_rows = 0
            self._shown = np.full((HEATMAP_MAX_COLUMNS + 1, len(order)), MISSING,
                                  dtype=np.float32)
            self._rgba = np.zeros((HEATMAP_MAX_COLUMNS + 1, len(order), 4), dtype=np.uint8)
        elif count == self._count:
            self.show_selection(view.selected_layer, view.selected_step)
            return
        self._count = count
        matrix = history.matrix("grad_norm")
        identity = np.array_equal(columns, np.arange(matrix.shape[1]))
        complete = count // per_row
        if complete > self._blocks:
            new = matrix[self._blocks * per_row: complete * per_row]
            new = new if identity else new[:, columns]
            new = _mark_skipped(
                new, skipped_rows(history, self._blocks * per_row, complete * per_row))
            reduced, _ = reduce_steps(new, limit=max(1, len(new) // per_row))
            self._shown[self._blocks: complete] = reduced
            self._low_high = _finite_log_range(reduced, self._low_high)
            self._blocks = complete
        rows = complete
        low, high = self._low_high
        if count > complete * per_row:  # the last, incomplete block
            tail = matrix[complete * per_row: count]
            tail = tail if identity else tail[:, columns]
            tail = _mark_skipped(tail, skipped_rows(history, complete * per_row, count))
            self._shown[complete] = tail.max(axis=0)
            low, high = _finite_log_range(self._shown[complete: complete + 1], (low, high))
            rows += 1
        matrix = self._shown[:rows]
        self._matrix = matrix
        self.steps_per_column = per_row
        self._steps = history.steps.astype(np.float64)
        if not math.isfinite(low):
            low, high = 0.0, 1.0
        if high - low < 1e-6:
            low, high = low - 0.5, high + 0.5
        self.levels = (low, high)
        # Colour only the blocks not coloured yet, unless the colour scale moved.
        first = self._colored_rows if self._colored_levels == (low, high) else 0
        first = min(first, complete)
        self._rgba[first:rows] = _colorize(matrix[first:rows], low, high)
        self._colored_levels, self._colored_rows = (low, high), complete
        self.rgba = self._rgba[:rows]
        self.image.setImage(self.rgba, autoLevels=False)
        first_step = self._steps[0]
        width = rows * per_row
        self.image.setRect(QRectF(first_step - 0.5, -0.5, max(width, 1), len(order)))
        self.colorbar.setLevels((low, high))
        skipped = bool(history.skipped[:count].any())
        if skipped != self._skipped_title:
            self._skipped_title = skipped
            self.item.setTitle("log10 ‖grad‖ (red: NaN/Inf, white: 0"
                               + (", purple: skipped by the loss scaler)" if skipped else ")"),
                               size="10pt")
        self.show_selection(view.selected_layer, view.selected_step)

    def show_selection(self, layer: str | None, step: int | None) -> None:
        self.step_line.setVisible(step is not None)
        if step is not None:
            self.step_line.setValue(step)
        visible = layer in self._order
        self.layer_line.setVisible(visible)
        if visible:
            self.layer_line.setValue(self._order.index(layer))

    def cell_at(self, scene_pos: QPointF) -> tuple[str, int, float] | None:
        if not self.item.vb.sceneBoundingRect().contains(scene_pos) or not len(self._steps):
            return None
        point = self.item.vb.mapSceneToView(scene_pos)
        row = round(point.x() - self._steps[0])
        column = round(point.y())
        if not (0 <= row < len(self._steps) and 0 <= column < len(self._order)):
            return None
        block = row // self.steps_per_column
        return self._order[column], int(self._steps[row]), float(self._matrix[block, column])

    def _on_scene_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        cell = self.cell_at(event.scenePos())
        if cell is not None:
            self.selection_made.emit(Selection(cell[0], cell[1]))

    def _on_scene_mouse_moved(self, scene_pos: QPointF) -> None:
        cell = self.cell_at(scene_pos)
        if cell is None:
            return
        name, step, value = cell
        text = ("not watched" if value == MISSING else
                f"overflowed: {SKIPPED_WORDS}" if value == SKIPPED_CELL else
                f"‖grad‖ = {format_value(value)}")
        global_pos = self.widget.mapToGlobal(self.widget.mapFromScene(scene_pos))
        QToolTip.showText(global_pos, f"{name or '(model)'}\nstep {step}\n{text}", self.widget)


class GradientFlowPlot(QWidget):
    """One horizontal bar per layer (rows shared with the heatmap) at the selected step."""

    selection_made = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        # Its rows are the heatmap's, which names them on its left: no second name column
        # (it took the chart's width at 1280x800 and cut its title and bars).
        self.axis = LayerAxis("left")
        self.axis.setStyle(showValues=False)
        self.axis.setWidth(8)
        self.widget = _plot_widget("Gradient flow", grid_y=False, left=self.axis)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self.item = self.widget.getPlotItem()
        self.item.vb.invertY(True)
        self.item.getAxis("bottom").setLogMode(True)
        self.item.setLabel("bottom", "‖grad‖")
        self.bars = pg.BarGraphItem(x0=[], x1=[], y=[], height=0.72)
        self.item.addItem(self.bars)
        self.explode_line = pg.InfiniteLine(
            angle=90, pen=pg.mkPen(STATUS_COLORS[2], width=1.5, style=Qt.PenStyle.DashLine),
            label="explode", labelOpts={"position": 0.96, "color": STATUS_COLORS[2],
                                        "fill": (255, 255, 255, 220)})
        self.vanish_line = pg.InfiniteLine(
            angle=90, pen=pg.mkPen(STATUS_COLORS[1], width=1.5, style=Qt.PenStyle.DashLine),
            label="vanish", labelOpts={"position": 0.04, "color": STATUS_COLORS[1],
                                       "fill": (255, 255, 255, 220)})
        for line in (self.explode_line, self.vanish_line):
            self.item.addItem(line)
        self.selected_box = pg.InfiniteLine(angle=0, pen=pg.mkPen("#000", width=1,
                                                                 style=Qt.PenStyle.DashLine))
        self.selected_box.setVisible(False)
        self.item.addItem(self.selected_box, ignoreBounds=True)
        self._labels: list[pg.TextItem] = []
        self._order: list[str] = []
        self._values = np.zeros(0)
        self.step: int | None = None
        self.widget.scene().sigMouseClicked.connect(self._on_scene_mouse_clicked)
        self.widget.scene().sigMouseMoved.connect(self._on_scene_mouse_moved)

    def refresh(self, view: PlotView) -> None:
        history = view.history
        order = [name for name in view.order if history.has_layer(name)]
        self._order = order
        if self.axis.names != order:
            self.axis.names = order
            self.axis.picture = None
            self.axis.update()
        for label in self._labels:
            self.item.removeItem(label)
        self._labels = []
        self.explode_line.setValue(math.log10(view.explode_threshold)
                                   if view.explode_threshold > 0 else 0)
        self.vanish_line.setVisible(view.vanish_threshold > 0)
        if view.vanish_threshold > 0:
            self.vanish_line.setValue(math.log10(view.vanish_threshold))
        step = view.selected_step
        row = history.row_of_step(step) if step is not None else (
            history.count - 1 if history.count else None)
        if row is None or not order:
            self.bars.setOpts(x0=[], x1=[], y=[], brushes=[])
            self.widget.setTitle("Gradient flow", size="10pt")
            self._values = np.zeros(0)
            return
        self.step = int(history.steps[row])
        self.widget.setTitle(view.flow_title if view.flow is not None else
                             f"Gradient flow at step {self.step}", size="10pt")
        columns = [history.column(name) for name in order]
        values = history.matrix("grad_norm")[row, columns].astype(np.float64)
        status = history.status_matrix()[row, columns]
        if view.flow is not None:
            values = np.array([view.flow.get(name, MISSING) for name in order])
            status = np.array([classify_for_display(v, view) for v in values], dtype=np.uint8)
        self._values = values
        logged = log10_display(values)
        finite = np.isfinite(logged)
        thresholds = [math.log10(t) for t in (view.explode_threshold, view.vanish_threshold)
                      if t > 0]
        low = min([*logged[finite].tolist(), *thresholds]) - 1
        high = max([*logged[finite].tolist(), *thresholds]) + 1
        x0, x1, ys, brushes = [], [], [], []
        for i, (value, log_value) in enumerate(zip(values, logged, strict=True)):
            if value == MISSING or status[i] == STATUS_MISSING:
                continue
            if not math.isfinite(value):
                end = high
                label = pg.TextItem("NaN" if math.isnan(value) else "Inf", color="w",
                                    anchor=(1, 0.5))
                label.setFont(QFont("", 9, QFont.Weight.Bold))
                label.setPos(high, i)
                self.item.addItem(label, ignoreBounds=True)
                self._labels.append(label)
            elif value == 0:
                end = low + 0.05
            else:
                end = log_value
            x0.append(low)
            x1.append(end)
            ys.append(i)
            brushes.append(_status_brush(int(status[i])))
        if ys:
            self.bars.setOpts(x0=x0, x1=x1, y=ys, height=0.72, brushes=brushes,
                              pens=[pg.mkPen(None)] * len(ys))
        else:  # pyqtgraph's BarGraphItem fails on an empty pens list
            self.bars.setOpts(x0=[], x1=[], y=[], brushes=[])
        self.item.setXRange(low, high, padding=0.02)
        self.show_selection(view.selected_layer)

    def show_selection(self, layer: str | None) -> None:
        visible = layer in self._order
        self.selected_box.setVisible(visible)
        if visible:
            self.selected_box.setValue(self._order.index(layer))

    def _layer_at(self, scene_pos: QPointF) -> int | None:
        if not self.item.vb.sceneBoundingRect().contains(scene_pos):
            return None
        i = round(self.item.vb.mapSceneToView(scene_pos).y())
        return i if 0 <= i < len(self._order) else None

    def _on_scene_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        i = self._layer_at(event.scenePos())
        if i is not None:
            self.selection_made.emit(Selection(self._order[i], self.step))

    def _on_scene_mouse_moved(self, scene_pos: QPointF) -> None:
        i = self._layer_at(scene_pos)
        if i is None or i >= len(self._values):
            return
        value = self._values[i]
        text = "not watched" if value == MISSING else f"‖grad‖ = {format_value(value)}"
        global_pos = self.widget.mapToGlobal(self.widget.mapFromScene(scene_pos))
        QToolTip.showText(global_pos, f"{self._order[i] or '(model)'}\nstep {self.step}\n{text}",
                          self.widget)


class PlotPanel(QWidget):
    """The four plots in resizable splitters, with step axes and layer rows linked."""

    selection_made = Signal(object)  # Selection

    def __init__(self) -> None:
        super().__init__()
        self.gradient_norm = GradientNormPlot()
        self.loss = LossPlot()
        self.heatmap = HeatmapPlot(self.gradient_norm.cache)
        self.flow = GradientFlowPlot()
        self.loss.item.setXLink(self.gradient_norm.item)
        self.heatmap.item.setXLink(self.gradient_norm.item)
        self.flow.item.setYLink(self.heatmap.item)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(self.gradient_norm)
        top.addWidget(self.loss)
        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(self.heatmap)
        bottom.addWidget(self.flow)
        for splitter in (top, bottom):
            splitter.setStretchFactor(0, 64)
            splitter.setStretchFactor(1, 36)
            splitter.setChildrenCollapsible(False)
        # The two splitters move together so that the step axes stay aligned.
        top.splitterMoved.connect(lambda *_: bottom.setSizes(top.sizes()))
        bottom.splitterMoved.connect(lambda *_: top.setSizes(bottom.sizes()))
        outer = QSplitter(Qt.Orientation.Vertical)
        outer.addWidget(top)
        outer.addWidget(bottom)
        outer.setStretchFactor(0, 55)
        outer.setStretchFactor(1, 45)
        outer.setChildrenCollapsible(False)
        self.splitters = (top, bottom, outer)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(outer)
        for plot in (self.gradient_norm, self.loss, self.heatmap, self.flow):
            plot.selection_made.connect(self.selection_made)
            plot.item.vb.sigRangeChangedManually.connect(self._on_view_range_changed_manually)
        self._last_view: PlotView | None = None
        self._fitted: dict[tuple[int, str], tuple] = {}  # see _set_range
        # Linked views turn each other's auto-range off, so the shared step axis and layer
        # rows are ranged here, until the user zooms or pans (View > Reset plot zoom).
        self.follow_range = True

    def _on_view_range_changed_manually(self, *_: object) -> None:
        self.follow_range = False

    def refresh(self, view: PlotView) -> None:
        self._last_view = view
        if self.follow_range:
            # First the view, then the data: the gradient-norm plot draws what is in view.
            self.gradient_norm.hold(True)
            try:
                self._fit_shared_axes(view)
            finally:
                self.gradient_norm.hold(False)
        self.gradient_norm.refresh(view)
        self.loss.refresh(view)
        self.heatmap.refresh(view)
        self.flow.refresh(view)
        self._fit_left_axes()
        # Settle the auto-ranges now: done in the paint, a range change asks for a second
        # paint of the plot (and of the plots linked to it).
        for plot in (self.gradient_norm, self.loss, self.heatmap, self.flow):
            plot.item.vb.prepareForPaint()

    def _fit_left_axes(self) -> None:
        """The heatmap's layer names fit; the gradient-norm plot above keeps the same left
        axis width, so that the two step axes line up."""
        width = min(_MAX_LEFT_AXIS_WIDTH, max(_LEFT_AXIS_WIDTH, self.heatmap.axis.needed_width()))
        for axis in (self.heatmap.axis, self.gradient_norm.item.getAxis("left")):
            if axis.width() != width:
                axis.setWidth(width)

    def _fit_shared_axes(self, view: PlotView) -> None:
        history = view.history
        if history.count:
            first, last = float(history.steps[0]), float(history.steps[-1])
            # At least ten steps wide, so that a short run has whole-step ticks.
            last = max(last, first + 9)
            if view.live:
                # While steps arrive the step axis grows in jumps of about an eighth of its
                # span, not at every redraw: each change redraws three step axes and their
                # grids. The fit is exact again when the run stops.
                jump = _round_up_to_nice((last - first) / 8)
                last = first + math.ceil((last - first) / jump) * jump
            self._set_range(self.gradient_norm.item, "x", first - 0.5, last + 0.5, 0.02)
        layers = sum(1 for name in view.order if history.has_layer(name))
        if layers:
            self._set_range(self.heatmap.item, "y", -0.5, layers - 0.5, 0)

    def _set_range(self, item: pg.PlotItem, axis: str, low: float, high: float,
                   padding: float) -> None:
        # Setting a range, even an unchanged one, updates the linked plots and their axes'
        # labels (a few milliseconds a redraw): skipped while the view still shows what the
        # same request gave last time.
        index = 0 if axis == "x" else 1
        key = (id(item), axis)
        request = (low, high, padding)
        shown = tuple(item.vb.viewRange()[index])
        if self._fitted.get(key) == (request, shown):
            return
        if axis == "x":
            item.setXRange(low, high, padding=padding)
        else:
            item.setYRange(low, high, padding=padding)
        self._fitted[key] = (request, tuple(item.vb.viewRange()[index]))

    def show_selection(self, layer: str | None, step: int | None) -> None:
        self.gradient_norm.show_selection(layer, step)
        self.loss.show_selection(step)
        self.heatmap.show_selection(layer, step)
        if self._last_view is not None:
            self._last_view.selected_layer = layer
            self._last_view.selected_step = step
            self.flow.refresh(self._last_view)

    def clear(self) -> None:
        """Forget the last model or recording: its curves and its zoom (a new one starts
        fitted; an old zoom can leave its steps out of view, blank plots)."""
        self.gradient_norm.clear()
        self._last_view = None
        self._fitted.clear()
        self.follow_range = True
        for plot in (self.gradient_norm, self.loss):
            plot.item.enableAutoRange(axis="y")

    def auto_range(self) -> None:
        self.follow_range = True
        for plot in (self.gradient_norm, self.loss):
            plot.item.enableAutoRange(axis="y")
        if self._last_view is not None:
            self.refresh(self._last_view)
