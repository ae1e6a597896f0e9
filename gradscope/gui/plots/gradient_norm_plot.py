"""Gradient norm against step, one curve per ticked layer (log y); non-finite points as
markers pinned to the top edge and exact zeros to the bottom edge."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPoint, QPointF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics
from PySide6.QtWidgets import QComboBox, QVBoxLayout

from gradscope.core.history import MISSING, ParameterNorms, RunHistory
from gradscope.gui.mixed_precision import (
    SKIPPED_WORDS,
    SkippedMarkers,
)
from gradscope.gui.peak_raster import PeakRasterItem
from gradscope.gui.plot_axes import elapsed_text, elide
from gradscope.gui.plots.compared_markers import (
    COMPARED_NONFINITE_WORDS,
    ComparedMarkers,
    layer_marks,
)
from gradscope.gui.plots.display_values import ema_display, log10_display
from gradscope.gui.plots.hover_label import HoverLabelPlot
from gradscope.gui.plots.log_norm_cache import LogNormCache
from gradscope.gui.plots.peak_cache import PeakLevels
from gradscope.gui.plots.plot_view import PlotView
from gradscope.gui.plots.plot_widget import DOTS_UP_TO, LEFT_AXIS_WIDTH, make_plot_widget
from gradscope.gui.plots.statistic_choice import (
    DETAIL_ONLY,
    PER_PARAMETER,
    StatisticSelector,
)
from gradscope.gui.plots.step_zoom import StepZoomViewBox
from gradscope.gui.plots.warning_guides import WarningGuides, guiding_warning
from gradscope.gui.selection import Selection
from gradscope.gui.status_style import (
    NONFINITE_MARKER_COLOR,
    ZERO_MARKER_COLOR,
    format_value,
)

_HOVER_PIXELS = 9
_LEGEND_MAX = 8  # entries: with more layers, the selected and the first ones, then "+N more"
# More ticked layers than this: one connect-array curve per colour instead of one per layer.
GROUPED_ABOVE = 40
_EDGE_LEGEND = "\x00edge"

# The raw values' alpha behind a smoothed curve (TensorBoard's faint raw line).
RAW_ALPHA = 60


class GradientNormPlot(HoverLabelPlot):
    selection_made = Signal(object)  # Selection
    statistic_changed = Signal(str)  # the history statistic now shown
    # A right-click on a curve: (layer, global position) for the layer's menu.
    layer_menu_requested = Signal(str, QPoint)

    def __init__(self) -> None:
        super().__init__()
        self.widget = make_plot_widget("Gradient norm per layer", view_box=StepZoomViewBox())
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self.item = self.widget.getPlotItem()
        self.item.setLabel("left", "‖grad‖")
        self.item.setLabel("bottom", "step")
        self.statistic_selector = StatisticSelector(self.widget, per_parameter=True)
        self.statistic_selector.statistic_chosen.connect(self._on_statistic_selector_chosen)
        self.item.vb.context_menu_at = self._request_layer_menu
        self.linear = False
        self.scale_choice = QComboBox(self.widget)
        self.scale_choice.addItems(["log", "linear"])
        self.scale_choice.setToolTip("The value axis: log (default) or linear")
        self.scale_choice.setFont(self.statistic_selector.font())
        self.scale_choice.adjustSize()
        self.scale_choice.move(self.statistic_selector.width() + 6, 2)
        self.scale_choice.currentIndexChanged.connect(self._on_scale_choice_changed)
        self.item.getAxis("left").setLogMode(True)
        self.item.getAxis("left").setWidth(LEFT_AXIS_WIDTH)
        self.item.setClipToView(True)
        self.item.setDownsampling(ds=True, auto=True, mode="peak")
        # Under the step axis, not over the curves (it hid the data), in columns.
        self.legend = pg.LegendItem(labelTextSize="8pt", colCount=1, verSpacing=-6)
        self.item.layout.addItem(self.legend, 4, 1)
        self._legend_names: list[str] = []
        self._legend_limit_used = _LEGEND_MAX
        self._legend_more = pg.PlotDataItem(pen=None)  # the sample of the "+N more" entry
        # A click on "+N more" lists every ticked layer (which colour is which was found
        # only by hovering); "fewer" folds it again.
        self.legend_expanded = False
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
        # Other runs' curves of the ticked layers (run name, layer) -> curve, and what each
        # was last fed with.
        self.compared_curves: dict[tuple[str, str], pg.PlotDataItem] = {}
        self._compared_state: dict[tuple[str, str], tuple] = {}
        self.missing_in_compared: dict[str, list[str]] = {}  # run name -> ticked layers
        # Their own NaN/Inf and skipped steps (hollow, under the shown run's markers).
        self.compared_marks = ComparedMarkers(self.item)
        self._compared_marks_key: tuple | None = None
        self._sparse_memo: dict[tuple, bool] = {}  # see _measured_sparsely
        # The layers' values (shared with the heatmap, which reads its resets) and, while
        # the selector shows per-parameter norms, the parameters'.
        self.layer_cache = LogNormCache()
        self.parameter_cache = LogNormCache()
        self.per_parameter = False
        self._show_title()
        self._owner: dict[str, str] = {}  # parameter -> its layer, per parameter
        # Steps drawn at their wall-clock time (seconds since the run's first step).
        self.wall_clock = False
        self._x = np.zeros(0)
        # With smoothing: each layer's raw values, drawn faint behind its smoothed curve.
        self.smoothing = 0.0
        self.raw_curves: dict[str, pg.PlotDataItem] = {}
        self._peaks = PeakLevels()
        self._history: RunHistory | ParameterNorms | None = None
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
        self.markers = pg.ScatterPlotItem(
            size=13,
            pxMode=True,
            symbol="x",
            brush=pg.mkBrush(NONFINITE_MARKER_COLOR),
            pen=pg.mkPen(NONFINITE_MARKER_COLOR, width=2.5),
        )
        self.markers.setZValue(20)
        self.item.addItem(self.markers, ignoreBounds=True)
        self.skipped = SkippedMarkers(self.item, pinned=True)
        self.warning_guides = WarningGuides(self.item)
        self.item.vb.addItem(self.group_lines)
        self.item.vb.addItem(self.group_dots)
        self._marker_brushes = (pg.mkBrush(ZERO_MARKER_COLOR), pg.mkBrush(NONFINITE_MARKER_COLOR))
        self._marker_pens = (
            pg.mkPen(ZERO_MARKER_COLOR, width=1),
            pg.mkPen(NONFINITE_MARKER_COLOR, width=1),
            pg.mkPen(NONFINITE_MARKER_COLOR, width=2.5),
        )
        self.step_line = pg.InfiniteLine(
            angle=90, pen=pg.mkPen("#555", width=1, style=Qt.PenStyle.DashLine)
        )
        self.step_line.setVisible(False)
        self.item.addItem(self.step_line, ignoreBounds=True)
        self.hover = pg.TextItem(
            anchor=(0, 1),
            color="#111",
            fill=pg.mkBrush(255, 255, 230, 235),
            border=pg.mkPen("#999"),
        )
        self.hover.setZValue(50)
        self.hover.setVisible(False)
        self.item.addItem(self.hover, ignoreBounds=True)
        self.hover_text = ""
        self.item.vb.sigRangeChanged.connect(self._on_view_range_changed)
        self.item.vb.sigResized.connect(self._on_view_range_changed)
        self.widget.viewport().installEventFilter(self)
        scene = self.widget.scene()
        scene.sigMouseMoved.connect(self._on_scene_mouse_moved)
        scene.sigMouseClicked.connect(self._on_scene_mouse_clicked)

    @property
    def cache(self) -> LogNormCache:
        return self.parameter_cache if self.per_parameter else self.layer_cache

    @property
    def statistic(self) -> str:
        return PER_PARAMETER if self.per_parameter else self.cache.statistic

    @property
    def _value_statistic(self) -> str:
        """The statistic read from the history drawn (a parameter's norm is its only one)."""
        return "grad_norm" if self.per_parameter else self.cache.statistic

    def _request_layer_menu(self, scene_pos: QPointF, screen_pos: QPoint) -> bool:
        """A right-click on a curve asks for that layer's menu; elsewhere, pyqtgraph's."""
        found = self.nearest(scene_pos)
        if found is None or found[0] not in self._visible:
            return False
        self.layer_menu_requested.emit(self._owner.get(found[0], found[0]), screen_pos)
        return True

    def _on_statistic_selector_chosen(self, statistic: str) -> None:
        per_parameter = statistic == PER_PARAMETER
        if per_parameter != self.per_parameter:
            self.clear()  # other curves: the parameters' or the layers'
            self.per_parameter = per_parameter
        if not per_parameter:
            self._owner = {}
            self.layer_cache.set_statistic(statistic)
        self._curve_state.clear()
        self._group_key = self._edge_key = None
        self.item.setLabel("left", self.statistic_selector.label(statistic))
        self._show_title()
        self.statistic_changed.emit(statistic)

    def _show_title(self, note: str = "") -> None:
        title = self.statistic_selector.title(self.statistic)
        title += "" if self.per_parameter else " per layer"
        # Right-aligned: the statistic and scale boxes lie over the top-left corner (a centred
        # title read "radient norm per layer" at 1280x800).
        self.widget.setTitle(title + note, size="10pt", justify="right")

    def set_wall_clock(self, wall_clock: bool) -> None:
        """Draw the steps at their wall-clock time (seconds since the run's first step, h:mm:ss
        ticks) instead of their number."""
        if wall_clock == self.wall_clock:
            return
        self.wall_clock = wall_clock
        for cache in (self.layer_cache, self.parameter_cache):
            cache.set_wall_clock(wall_clock)
        self._curve_state.clear()
        self._compared_state.clear()
        self._group_key = self._edge_key = None
        self.item.getAxis("bottom").set_time_ticks(wall_clock)
        self.item.setLabel("bottom", "time since the first step" if wall_clock else "step")

    def x_of_step(self, step: int) -> float:
        """Where step ``step`` is drawn on the x axis."""
        if not self.wall_clock or not len(self._steps):
            return float(step)
        row = min(int(np.searchsorted(self._steps, step)), len(self._steps) - 1)
        return float(self._x[row])

    def _parameter_view(self, view: PlotView) -> PlotView:
        """``view`` with each ticked layer's parameters in its place: their names, the
        layer's colour (lighter for each further parameter of the layer)."""
        norms = view.history.parameter_norms
        self._owner = dict(zip(norms.layer_names, norms.owner, strict=True))
        order = norms.params_of(view.order)
        visible = set(norms.params_of([n for n in view.order if n in view.visible]))
        colors: dict[str, QColor] = {}
        index_in_layer: dict[str, int] = {}
        for name in order:
            layer = self._owner[name]
            k = index_in_layer[layer] = index_in_layer.get(layer, -1) + 1
            color = QColor(view.colors.get(layer, QColor("#1f77b4")))
            colors[name] = color.lighter(100 + 45 * k) if k else color
        compared = tuple(
            dataclasses.replace(run, history=run.history.parameter_norms) for run in view.compared
        )
        self._show_title(
            " (none stored in this recording)" if view.history.count and not norms.count else ""
        )
        return dataclasses.replace(
            view,
            history=norms,
            order=order,
            visible=visible,
            colors=colors,
            selected_layer=None,
            compared=compared,
        )

    # -- drawing -------------------------------------------------------------------------
    def refresh(self, view: PlotView) -> None:
        self.statistic_selector.offer(view.history)
        if self.per_parameter:
            view = self._parameter_view(view)
        history = view.history
        self._history = history
        self._colors = view.colors
        cache = self.cache
        cache.update(history)
        rows = cache.rows
        self._steps = cache.steps[:rows]
        self._x = cache.x[:rows]
        self._names = list(history.layer_names)
        visible = [name for name in view.order if name in view.visible and history.has_layer(name)]
        self._columns = np.fromiter(
            (history.column(n) for n in visible), dtype=np.intp, count=len(visible)
        )
        self._visible = visible
        grouped = len(visible) > GROUPED_ABOVE
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
        for name, raw in self.raw_curves.items():
            if raw.isVisible() and not (self.curves[name].isVisible() and self.smoothing > 0):
                raw.setVisible(False)
        self._update_edges()
        self.skipped.refresh(history, x=self._x)
        self._update_compared(view, visible)
        self._update_legend(visible)
        self.show_selection(view.selected_layer, view.selected_step)
        self._update_warning_guides(view, visible)
        self._redraw_view_dependent()

    def _update_warning_guides(self, view: PlotView, visible: list[str]) -> None:
        """The limit and projection of a warning on the statistic shown (the layers' own
        statistics only: a parameter has no warning of its own)."""
        warnings = () if self.per_parameter else view.history.warnings
        warning = guiding_warning(
            warnings, self.statistic, set(visible), view.selected_layer, view.selected_step
        )
        x = self.x_of_step(warning.step) if warning is not None else 0.0
        self.warning_guides.refresh(
            warning,
            lambda values: self._y(np.log10(values)),
            x,
            project=not self.wall_clock,
        )

    def _layer_curve(self, name: str) -> pg.PlotDataItem:
        curve = self.curves.get(name)
        if curve is None:
            color = self._colors.get(name, QColor("#1f77b4"))
            curve = pg.PlotDataItem(
                name=name or "(model)", connect="finite", autoDownsampleFactor=1.0
            )
            curve.setPen(pg.mkPen(color, width=1))
            self.item.addItem(curve)
            self.curves[name] = curve
        return curve

    def _measured_sparsely(self, history: RunHistory | ParameterNorms | None) -> bool:
        """The statistic shown is measured on some steps only (detail steps): its values
        are points with nothing between. Measured every step (``detail_every=1``), it is a
        line like the gradient norm (it was drawn as loose dots)."""
        if history is None or not history.count:
            return False
        if self.statistic not in DETAIL_ONLY:  # a named statistic: its schedule says
            return self.statistic_selector.points_only(self.statistic)
        key = (id(history), history.count, self._value_statistic)
        found = self._sparse_memo.get(key)
        if found is None:
            measured = (history.matrix(self._value_statistic) != MISSING).any(axis=1)
            found = not bool(measured.all())
            if len(self._sparse_memo) > 16:
                self._sparse_memo.clear()
            self._sparse_memo[key] = found
        return found

    def _y(self, logged: np.ndarray) -> np.ndarray:
        """Drawn y of log10 values: themselves on the log axis, 10**them on a linear one."""
        if not self.linear:
            return logged
        with np.errstate(over="ignore"):
            return np.power(10.0, np.asarray(logged, dtype=np.float64))

    def _on_scale_choice_changed(self, index: int) -> None:
        self.set_linear(index == 1)
        self.statistic_changed.emit(self.statistic)  # the panel redraws and refits

    def set_linear(self, linear: bool) -> None:
        """A linear value axis instead of the log one (the cache keeps log10 values; zeros
        and NaN/Inf stay markers at the edges either way)."""
        if linear == self.linear:
            return
        self.linear = linear
        self.item.getAxis("left").setLogMode(not linear)
        self._curve_state.clear()
        self._compared_state.clear()
        self._group_key = None
        self.item.enableAutoRange(axis="y")
        self.scale_choice.setCurrentIndex(1 if linear else 0)

    def set_smoothing(self, weight: float) -> None:
        """The smoothing slider's weight (0: the raw values only)."""
        if weight != self.smoothing:
            self.smoothing = weight
            self._curve_state.clear()

    def _update_layer_curve(self, name: str, shown: bool) -> None:
        """Give one layer's curve its data (views of the cache) if it changed."""
        curve = self._layer_curve(name)
        curve.setVisible(shown)
        if not shown:
            self._curve_state.pop(name, None)
            if name in self.raw_curves:
                self.raw_curves[name].setVisible(False)
            return
        cache = self.cache
        state = (cache.generation, name == self._selected, self.smoothing, self.linear)
        if self._curve_state.get(name) == state:
            return
        self._curve_state[name] = state
        logged = cache.values[self._history.column(name), : cache.rows]
        raw = self.raw_curves.get(name)
        if self.smoothing > 0:
            # The raw values faint behind, the smoothed curve over them.
            if raw is None:
                raw = self.raw_curves[name] = pg.PlotDataItem(connect="finite")
                raw.setZValue(-5)
                self.item.addItem(raw)
            faint = QColor(self._colors.get(name, QColor("#1f77b4")))
            faint.setAlpha(RAW_ALPHA)
            raw.setData(self._x, self._y(logged), connect="finite", pen=pg.mkPen(faint, width=1))
            raw.setVisible(True)
            logged = ema_display(logged, self.smoothing)
        elif raw is not None:
            raw.setVisible(False)
        # Dots while there are few steps (one has no line), and always for a statistic
        # measured on detail steps only: its values are points, with nothing between.
        few = (cache.rows <= DOTS_UP_TO or self._measured_sparsely(self._history)) and bool(
            np.isfinite(logged).any()
        )
        color = self._colors.get(name, QColor("#1f77b4"))
        curve.setData(
            self._x,
            self._y(logged),
            connect="finite",
            symbol="o" if few else None,
            symbolSize=4,
            symbolBrush=color,
            symbolPen=None,
        )

    def resizeEvent(self, event: object) -> None:
        super().resizeEvent(event)
        if self._legend_limit() != self._legend_limit_used:
            self._legend_names = ["-"]  # rebuilt for the new size
            self._update_legend(self._visible)
        self._fit_legend_columns()

    def _legend_limit(self) -> int:
        """How many layer entries the legend may take: all of them (up to _LEGEND_MAX) in a
        tall plot, fewer as the plot gets short, so that the curves keep most of it (at
        1000x650 the legend took all but a 30 px strip)."""
        rows = min(4, 1 + max(0, (self.widget.height() - 320) // 130))
        columns = max(1, int((self.widget.width() - LEFT_AXIS_WIDTH) / 110))
        return max(1, min(_LEGEND_MAX, rows * columns))

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
        widest = max(
            (metrics.horizontalAdvance(label.text) + 34 for _, label in self.legend.items),
            default=150,
        )
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
        steps = cache.x[:rows]  # where each step is drawn
        first = max(0, int(np.searchsorted(steps, x0, side="left")) - 1)
        last = min(rows, int(np.searchsorted(steps, x1, side="right")) + 1)
        per_block = PeakLevels.block_size((last - first) / max(vb.width(), 1.0))
        key = (cache.generation, self._columns.tobytes(), first, last, per_block)
        if key == self._group_key:
            return
        self._group_key = key
        columns = self._columns
        points_only = self._measured_sparsely(self._history)
        if points_only or per_block == 1:
            # Points only (see DETAIL_ONLY): every measured value in view, not blocks.
            x = steps[first:last]
            low = high = cache.values[columns, first:last]
        else:
            peaks = self._peaks.level(cache, per_block)
            start = first // per_block
            stop = min(peaks.blocks, -(-last // per_block))
            low = peaks.low[columns, start:stop]
            high = peaks.high[columns, start:stop]
            x = steps[start * per_block : stop * per_block : per_block]
            tail = rows - peaks.blocks * per_block
            if last > peaks.blocks * per_block and tail:  # the incomplete last block
                rest = cache.values[columns, peaks.blocks * per_block : rows]
                low = np.concatenate([low, rest.min(axis=1, keepdims=True)], axis=1)
                high = np.concatenate([high, rest.max(axis=1, keepdims=True)], axis=1)
                x = np.append(x, steps[peaks.blocks * per_block])
        color_index, colors = self._group_colors()
        if points_only:
            self.group_lines.set_data(
                np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0)), np.zeros(0), []
            )
        else:
            self.group_lines.set_data(x, self._y(low), self._y(high), color_index, colors)
        if rows <= DOTS_UP_TO or points_only:  # few steps (one has no line): dots too
            finite = np.isfinite(low)
            layer, point = np.nonzero(finite)
            brushes = [pg.mkBrush(color) for color in colors]
            self.group_dots.setData(
                x=x[point],
                y=self._y(low[finite]),
                brush=[brushes[i - 1] for i in color_index[layer].tolist()],
            )
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
        positions = cache.x[rows]
        # Markers of several layers at one step and edge sit on the same spot: keep one per
        # step and kind (NaN, Inf, zero), so a long run of zeros in hundreds of layers stays
        # a few thousand points, not millions.
        kind = np.where(np.isnan(values), 2, (values != 0).astype(np.int64))
        _, first = np.unique(rows.astype(np.int64) * 3 + kind, return_index=True)
        first.sort()
        columns, steps, values = columns[first], steps[first], values[first]
        positions = positions[first]
        top = values != 0
        nan = np.isnan(values)
        symbols = np.where(nan, "x", np.where(top, "t1", "t")).tolist()
        brushes = [self._marker_brushes[t] for t in top.tolist()]
        pens = [
            self._marker_pens[2 if n else int(t)]
            for n, t in zip(nan.tolist(), top.tolist(), strict=True)
        ]
        names = self._names
        data = [
            (names[c], int(s), float(v))
            for c, s, v in zip(columns.tolist(), steps.tolist(), values.tolist(), strict=True)
        ]
        self._edges = (positions, top, symbols, brushes, pens, data)
        self._edge_points = data

    def _update_compared(self, view: PlotView, visible: list[str]) -> None:
        """The compared runs' curves of the ticked layers, matched by name, in the layer's
        colour and the run's line style; a layer a run lacks is listed as missing."""
        wanted: set[tuple[str, str]] = set()
        self.missing_in_compared = {}
        for run in view.compared:
            self.missing_in_compared[run.name] = run.missing_layers(visible)
            for name in visible:
                if not run.history.has_layer(name):
                    continue
                key = (run.name, name)
                wanted.add(key)
                curve = self.compared_curves.get(key)
                if curve is None:
                    curve = pg.PlotDataItem(connect="finite", autoDownsampleFactor=1.0)
                    self.item.addItem(curve)
                    self.compared_curves[key] = curve
                state = (
                    id(run.history),
                    run.history.count,
                    self.statistic,
                    run.line_style,
                    self.linear,
                    self.wall_clock,
                )
                if self._compared_state.get(key) != state:
                    self._compared_state[key] = state
                    color = self._colors.get(name, QColor("#1f77b4"))
                    series = run.history.series(self._value_statistic, name)
                    values = self._y(log10_display(series))
                    points = self._measured_sparsely(run.history) or run.history.count <= DOTS_UP_TO
                    x = (
                        run.history.elapsed_seconds()
                        if self.wall_clock
                        else run.history.steps.astype(np.float64)
                    )
                    curve.setData(
                        x,
                        values,
                        connect="finite",
                        pen=pg.mkPen(color, width=1.4, style=run.line_style),
                        symbol="o" if points else None,
                        symbolSize=4,
                        symbolBrush=None,
                        symbolPen=pg.mkPen(color, width=1),
                    )
                curve.setVisible(True)
        for key, curve in list(self.compared_curves.items()):
            if key not in wanted:
                self.item.removeItem(curve)
                del self.compared_curves[key]
                self._compared_state.pop(key, None)
        marks_key = (
            tuple((run.name, id(run.history), run.history.count) for run in view.compared),
            self._value_statistic,
            tuple(visible),
            self.wall_clock,
        )
        if marks_key != self._compared_marks_key:
            self._compared_marks_key = marks_key
            self.compared_marks.refresh(
                tuple(
                    layer_marks(
                        run,
                        self._value_statistic,
                        visible,
                        run.history.elapsed_seconds()
                        if self.wall_clock
                        else run.history.steps.astype(np.float64),
                    )
                    for run in view.compared
                )
            )

    def _update_legend(self, visible: list[str]) -> None:
        # Many layers: the selected one and the first others, then how many more (hovering
        # a curve names it); the legend no longer disappears.
        shown = list(visible)
        more = 0
        limit = self._legend_limit_used = self._legend_limit()
        foldable = self.legend_expanded and len(shown) > limit
        if len(shown) > limit and not self.legend_expanded:
            first = [self._selected] if self._selected in shown else []
            rest = [n for n in shown if n not in first]
            shown = first + rest[: max(0, limit - 1 - len(first))]
            more = len(visible) - len(shown)
        if self._edge_points:
            shown = [*shown, _EDGE_LEGEND]
        skipped = bool(len(self.skipped.steps))
        compared_nonfinite = bool(len(self.compared_marks.nonfinite.data))
        key = [*shown, more, foldable, skipped, compared_nonfinite]
        if key == self._legend_names:
            return
        self.legend.clear()
        for name in shown:
            if name != _EDGE_LEGEND:
                # A sample item of the layer's colour, not its curve: with many layers the
                # curves are grouped, and a layer's own curve must not be made for it.
                sample = pg.PlotDataItem(
                    pen=pg.mkPen(self._colors.get(name, QColor("#1f77b4")), width=1.5)
                )
                self.legend.addItem(sample, elide(name, 22))
        if more:
            self.legend.addItem(self._legend_more, f"+{more} more ▸")
        elif foldable:
            self.legend.addItem(self._legend_more, "◂ fewer")
        if _EDGE_LEGEND in shown:
            self.legend.addItem(self.markers, "NaN/Inf top, 0 bottom")
        if skipped:
            self.legend.addItem(self.skipped.markers, SKIPPED_WORDS)
        if compared_nonfinite:
            self.legend.addItem(self.compared_marks.nonfinite, COMPARED_NONFINITE_WORDS)
        self._legend_names = key
        self.legend.setVisible(bool(shown) or skipped or compared_nonfinite)
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
            self.step_line.setValue(self.x_of_step(step))

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
        row = int(np.argmin(np.abs(self._x - point.x())))
        dx = (self._x[row] - point.x()) / pixel_width
        if abs(dx) <= _HOVER_PIXELS * 3 and len(self._columns) and self._history is not None:
            ys = self._y(self.cache.values[self._columns, row].astype(np.float64))
            distances = np.hypot(dx, (ys - point.y()) / pixel_height)
            distances[~np.isfinite(distances)] = np.inf
            i = int(np.argmin(distances))
            distance = float(distances[i])
            if distance <= _HOVER_PIXELS * 1.5 and (best is None or distance < best[0]):
                column = int(self._columns[i])
                value = float(self._history.matrix(self._value_statistic)[row, column])
                best = (distance, (self._names[column], int(self._steps[row]), value))
        return best[1] if best else None

    def clear(self) -> None:
        for curve in self.curves.values():
            self.item.removeItem(curve)
        self.curves.clear()
        self.group_lines.set_data(np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0)), np.zeros(0), [])
        self.group_dots.setData([])
        self._curve_state.clear()
        for curve in self.raw_curves.values():
            self.item.removeItem(curve)
        self.raw_curves.clear()
        for curve in self.compared_curves.values():
            self.item.removeItem(curve)
        self.compared_curves.clear()
        self._compared_state.clear()
        self.compared_marks.clear()
        self._compared_marks_key = None
        self._group_key = self._edge_key = None
        self._selected = None
        self._legend_names = ["-"]
        self.hide_hover()

    def _on_scene_mouse_moved(self, scene_pos: QPointF) -> None:
        found = self.nearest(scene_pos)
        if found is None:
            self.hide_hover()
            return
        name, step, value = found
        label = self.statistic_selector.label(self.statistic)
        when = f"step {step}"
        if self.wall_clock and len(self._steps):
            row = min(int(np.searchsorted(self._steps, step)), len(self._steps) - 1)
            when += f" · {elapsed_text(float(self._x[row]))} after the first step"
        self.hover_text = f"{name or '(model)'}\n{when}\n{label} = {format_value(value)}"
        self.hover.setText(self.hover_text)
        # On the side of the cursor where the label has room: below it in the upper part
        # of the plot, left of it in the right part (it was clipped at the top and right).
        rect = self.item.vb.sceneBoundingRect()
        right = scene_pos.x() > rect.left() + rect.width() * 0.6
        upper = scene_pos.y() < rect.top() + rect.height() * 0.4
        self.hover.setAnchor((1 if right else 0, 0 if upper else 1))
        self.hover.setPos(self.item.vb.mapSceneToView(scene_pos))
        self.hover.setVisible(True)

    def _legend_toggle_at(self, scene_pos: QPointF) -> bool:
        """The "+N more" / "fewer" entry is at ``scene_pos``."""
        return any(
            getattr(sample, "item", sample) is self._legend_more  # (an ItemSample holds it)
            and (
                label.sceneBoundingRect().contains(scene_pos)
                or sample.sceneBoundingRect().contains(scene_pos)
            )
            for sample, label in self.legend.items
        )

    def _on_scene_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        scene_pos = event.scenePos()
        if self.legend.isVisible() and self._legend_toggle_at(scene_pos):
            self.legend_expanded = not self.legend_expanded
            self._update_legend(self._visible)
            event.accept()
            return
        if not self.item.vb.sceneBoundingRect().contains(scene_pos):
            return
        found = self.nearest(scene_pos)
        if found is not None:
            # A parameter's curve selects its layer (the tree and the other plots show layers).
            self.selection_made.emit(Selection(self._owner.get(found[0], found[0]), found[1]))
        elif len(self._steps):
            x = self.item.vb.mapSceneToView(scene_pos).x()
            row = int(np.argmin(np.abs(self._x - x)))
            self.selection_made.emit(Selection(None, int(self._steps[row])))
