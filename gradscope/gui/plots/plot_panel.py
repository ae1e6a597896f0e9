"""The four plots in linked splitters."""

from __future__ import annotations

import dataclasses
import math

import pyqtgraph as pg
from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QSlider,
    QSplitter,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from gradscope.core.history import RunHistory
from gradscope.gui.plots.compared_runs import short_run_name
from gradscope.gui.plots.gradient_flow_plot import GradientFlowPlot
from gradscope.gui.plots.gradient_norm_plot import GradientNormPlot
from gradscope.gui.plots.heatmap_plot import HeatmapPlot
from gradscope.gui.plots.loss_plot import LossPlot
from gradscope.gui.plots.plot_view import PlotView
from gradscope.gui.plots.plot_widget import LEFT_AXIS_WIDTH
from gradscope.gui.plots.top_layers import LAYER_CHOICES, top_layers

WALL_CLOCK_TIP = (
    "The x axis of the gradient-norm and loss plots: the step number, or the wall-clock time "
    "since the run's first step (h:mm:ss, as TensorBoard's 'Relative'); each compared run "
    "from its own first step. The heatmap keeps steps."
)

# The layer-name axis of the heatmap (and the gradient-norm plot's, kept as wide so that
# their step axes line up) grows with the names, within these bounds.
_MAX_LEFT_AXIS_WIDTH = 170
# The empty-plot hint's padding (px), in its style sheet and where it is sized.
_HINT_PADDING = 8


def round_up_to_nice(value: float) -> float:
    """The smallest of 1, 2 or 5 times a power of ten that is at least ``value`` (>= 1)."""
    if value <= 1:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


class PlotPanel(QWidget):
    """The four plots in resizable splitters, with step axes and layer rows linked."""

    selection_made = Signal(object)  # Selection
    layer_menu_requested = Signal(str, QPoint)  # a right-click on a layer's curve

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
        layout.setSpacing(2)
        layout.addLayout(self._smoothing_row())
        layout.addWidget(outer)
        for plot in (self.gradient_norm, self.loss, self.heatmap, self.flow):
            plot.selection_made.connect(self.selection_made)
            plot.item.vb.sigRangeChangedManually.connect(self._on_view_range_changed_manually)
        for plot in (self.gradient_norm, self.heatmap, self.flow):
            plot.statistic_changed.connect(self._on_plot_statistic_changed)
        self.gradient_norm.layer_menu_requested.connect(self.layer_menu_requested)
        # Over the empty gradient-norm plot: how to get steps (it looked broken, blank).
        self.empty_hint = QLabel(self.gradient_norm.widget)
        self.empty_hint.setStyleSheet(
            "QLabel { color: #555; background: rgba(255, 255, 255, 220);"
            f" padding: {_HINT_PADDING}px;"
            " border: 1px solid #ccc; border-radius: 4px; font-size: 11pt; }"
        )
        self.empty_hint.setWordWrap(True)
        self.empty_hint.hide()
        # placed again when the drawing area is resized (it settles after the widget's resize)
        self.gradient_norm.item.vb.sigResized.connect(self._on_drawing_area_resized)
        self._last_view: PlotView | None = None
        self._fitted: dict[tuple[int, str], tuple] = {}  # see _set_range
        # Linked views turn each other's auto-range off, so the shared step axis and layer
        # rows are ranged here, until the user zooms or pans (View > Reset plot zoom).
        self.follow_range = True
        self._wall_clock_lacking: list[str] = []
        self._axis_values_shown = True  # see _show_axis_values

    def _smoothing_row(self) -> QHBoxLayout:
        """TensorBoard's smoothing slider: an exponential moving average of the gradient
        norms and the loss, the raw values faint behind."""
        row = QHBoxLayout()
        row.setContentsMargins(4, 0, 4, 0)
        label = QLabel("Smoothing")
        self.smoothing_slider = QSlider(Qt.Orientation.Horizontal)
        self.smoothing_slider.setRange(0, 99)
        self.smoothing_slider.setFixedWidth(160)
        self.smoothing_slider.setToolTip(
            "Exponential moving average of the gradient-norm curves and the loss (0: off); "
            "the raw values stay drawn, faint. Hover and click still read the raw values."
        )
        self.smoothing_value = QLabel("off")
        self.smoothing_value.setMinimumWidth(32)
        self.smoothing_slider.valueChanged.connect(self._on_smoothing_slider_value_changed)
        for widget in (label, self.smoothing_slider, self.smoothing_value):
            row.addWidget(widget)
        row.addSpacing(16)
        self.layer_choice = QComboBox()
        for choice, text in LAYER_CHOICES.items():
            self.layer_choice.addItem(text, choice)
        self.layer_choice.setToolTip(
            "Big models: plot only the ticked layers with the largest gradient norm at the "
            "last step, or the worst status so far"
        )
        self.layer_choice.currentIndexChanged.connect(self._on_layer_choice_changed)
        row.addWidget(self.layer_choice)
        row.addSpacing(16)
        # The step axis of the gradient-norm and loss plots, for every run shown: one
        # choice for both, as their step axes are linked (the heatmap's columns are steps
        # and stay so).
        row.addWidget(QLabel("X axis"))
        self.x_axis_choice = QComboBox()
        self.x_axis_choice.addItem("Step", "step")
        self.x_axis_choice.addItem("Wall-clock time", "wall_clock")
        self.x_axis_choice.setItemData(1, WALL_CLOCK_TIP, Qt.ItemDataRole.ToolTipRole)
        self.x_axis_choice.setToolTip(WALL_CLOCK_TIP)
        self.x_axis_choice.currentIndexChanged.connect(self._on_x_axis_choice_changed)
        row.addWidget(self.x_axis_choice)
        row.addStretch(1)
        return row

    @property
    def wall_clock(self) -> bool:
        return self.x_axis_choice.currentData() == "wall_clock"

    def _on_x_axis_choice_changed(self, _index: int) -> None:
        wall_clock = self.wall_clock
        self.gradient_norm.set_wall_clock(wall_clock)
        self.loss.set_wall_clock(wall_clock)
        # The heatmap's columns are steps: it keeps its step axis, unlinked meanwhile.
        self.heatmap.item.setXLink(None if wall_clock else self.gradient_norm.item)
        self._fitted.clear()
        self.follow_range = True
        if self._last_view is not None:
            self.refresh(self._last_view)

    def _offer_wall_clock(self, view: PlotView) -> None:
        """Wall-clock time only where every run shown has each step's time; otherwise the
        choice is greyed and says why (and a chosen wall-clock axis goes back to steps)."""
        runs = [(view.run_name, view.history), *((r.name, r.history) for r in view.compared)]
        lacking = [name for name, history in runs if history.count and not history.has_wall_time()]
        item = self.x_axis_choice.model().item(1)
        if item.isEnabled() == (not lacking) and self._wall_clock_lacking == lacking:
            return
        self._wall_clock_lacking = lacking
        item.setEnabled(not lacking)
        if lacking:
            names = ", ".join(short_run_name(name or "this run") for name in lacking)
            tip = (
                f"Wall-clock time is not available: {names} was recorded by a GradScope "
                "that did not stamp each step's time (record it again to get it)"
            )
            if self.wall_clock:
                self.x_axis_choice.setCurrentIndex(0)
        else:
            tip = WALL_CLOCK_TIP
        item.setToolTip(tip)
        self.x_axis_choice.setToolTip(tip)

    def _on_layer_choice_changed(self, _index: int) -> None:
        if self._last_view is not None:
            self.refresh(self._last_view)

    def _shown(self, view: PlotView) -> PlotView:
        """``view`` with its ticked layers cut to the top k the selector asks for."""
        choice = str(self.layer_choice.currentData())
        if choice == "ticked":
            return view
        chosen = top_layers(view.history, view.ticked_layers(), choice)
        return dataclasses.replace(view, visible=set(chosen))

    def _on_smoothing_slider_value_changed(self, value: int) -> None:
        weight = value / 100
        self.smoothing_value.setText(f"{weight:.2f}" if value else "off")
        self.gradient_norm.set_smoothing(weight)
        self.loss.smoothing = weight
        if self._last_view is not None:
            self.refresh(self._last_view)

    def _on_view_range_changed_manually(self, *_: object) -> None:
        self.follow_range = False

    def _on_plot_statistic_changed(self, _statistic: str) -> None:
        # Another statistic has other magnitudes: the value axis fits it afresh.
        self.gradient_norm.item.enableAutoRange(axis="y")
        if self._last_view is not None:
            self.refresh(self._last_view)

    def _on_drawing_area_resized(self, *_: object) -> None:
        if not self.empty_hint.isHidden():
            self._place_empty_hint()

    def _place_empty_hint(self) -> None:
        """Centred on the plot's drawing area and inside it, wrapped when the line is wider
        (at 1280x800 it ran over the axis and its label)."""
        parent = self.gradient_norm.widget
        hint = self.empty_hint
        area = parent.mapFromScene(self.gradient_norm.item.vb.sceneBoundingRect()).boundingRect()
        if area.width() < 120 or area.height() < 40:  # not laid out yet
            area = parent.rect()
        margins = hint.contentsMargins()
        padding = 2 * _HINT_PADDING + margins.left() + margins.right()
        natural = hint.fontMetrics().horizontalAdvance(hint.text()) + padding + 2  # the border
        width = max(100, min(natural, area.width() - 16))
        height = hint.heightForWidth(width)
        if height <= 0:  # no text yet
            height = hint.sizeHint().height()
        center = area.center()
        hint.setGeometry(center.x() - width // 2, center.y() - height // 2, width, height)

    def _show_empty_hint(self, view: PlotView) -> None:
        empty = not view.history.count and bool(view.empty_hint)
        if empty and self.empty_hint.text() != view.empty_hint:
            self.empty_hint.setText(view.empty_hint)
        if empty != self.empty_hint.isVisible():
            self.empty_hint.setVisible(empty)
        if empty:
            self._place_empty_hint()

    def _show_axis_values(self, view: PlotView) -> None:
        """No numbers on the axes while there is nothing to plot (no step yet, no run
        compared): the default ranges' ticks (steps -0.4 to 0.4, a norm of 5, a loss of
        0.1 to 0.9) are no figures of the run."""
        shown = bool(view.history.count) or any(run.history.count for run in view.compared)
        if shown == self._axis_values_shown:
            return
        self._axis_values_shown = shown
        axes = [self.heatmap.colorbar.getAxis("bottom")]
        for plot in (self.gradient_norm, self.loss, self.heatmap, self.flow):
            axes += [plot.item.getAxis("left"), plot.item.getAxis("bottom")]
        for axis in axes:
            axis.setStyle(showValues=shown)

    def refresh(self, view: PlotView) -> None:
        self._last_view = view
        self._offer_wall_clock(view)
        view = self._shown(view)
        self._show_empty_hint(view)
        self._show_axis_values(view)
        if self.follow_range:
            # First the view, then the data: the gradient-norm plot draws what is in view.
            self.gradient_norm.hold(True)
            try:
                self._fit_shared_axes(view)
            finally:
                self.gradient_norm.hold(False)
        # The rows are the layers shown, whatever the step zoom: they refit when that set
        # changes (after "Top 10" the ten rows were squeezed into a tenth of the height).
        layers = len(view.ticked_layers())
        if layers:
            self._set_range(self.heatmap.item, "y", -0.5, layers - 0.5, 0)
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
        width = min(_MAX_LEFT_AXIS_WIDTH, max(LEFT_AXIS_WIDTH, self.heatmap.axis.needed_width()))
        for axis in (self.heatmap.axis, self.gradient_norm.item.getAxis("left")):
            if axis.width() != width:
                axis.setWidth(width)

    def _fit_shared_axes(self, view: PlotView) -> None:
        history = view.history
        runs = [history, *(run.history for run in view.compared)]
        wall_clock = self.wall_clock
        if wall_clock and any(run.count for run in runs):
            # The heatmap is on steps, apart (see _on_x_axis_choice_changed).
            first = min(float(run.steps[0]) for run in runs if run.count)
            last = max(float(run.steps[-1]) for run in runs if run.count)
            self._set_range(self.heatmap.item, "x", first - 0.5, max(last, first + 9) + 0.5, 0.02)
        if any(run.count for run in runs):
            # Every run compared is in view, the shown one and the others.
            if wall_clock:  # seconds since each run's first step
                first = 0.0
                last = max(float(run.elapsed_seconds()[-1]) for run in runs if run.count)
                last = max(last, 10.0)  # at least ten seconds wide
            else:
                first = min(float(run.steps[0]) for run in runs if run.count)
                last = max(float(run.steps[-1]) for run in runs if run.count)
                # At least ten steps wide, so that a short run has whole-step ticks.
                last = max(last, first + 9)
            if view.live:
                # While steps arrive the step axis grows in jumps of about an eighth of its
                # span, not at every redraw: each change redraws three step axes and their
                # grids. The fit is exact again when the run stops.
                jump = round_up_to_nice((last - first) / 8)
                last = first + math.ceil((last - first) / jump) * jump
            margin = 0.0 if wall_clock else 0.5
            self._set_range(self.gradient_norm.item, "x", first - margin, last + margin, 0.02)
        if not any(run.count for run in runs):
            # No steps: the first ten, not pyqtgraph's -0.4 to 0.4 of an empty view.
            self._set_range(self.gradient_norm.item, "x", -0.5, 9.5, 0.02)

    def _set_range(
        self, item: pg.PlotItem, axis: str, low: float, high: float, padding: float
    ) -> None:
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
            self.flow.refresh(self._shown(self._last_view))

    def clear(self) -> None:
        """Forget the last model or recording: its curves and its zoom (a new one starts
        fitted; an old zoom can leave its steps out of view, blank plots)."""
        self.gradient_norm.clear()
        self.hide_hover()
        # Nothing of the last run's cursor and colour scale is left on the next one's plots.
        for line in (
            self.gradient_norm.step_line,
            self.loss.step_line,
            self.heatmap.step_line,
            self.heatmap.layer_line,
            self.flow.selected_box,
        ):
            line.setVisible(False)
        self.heatmap.colorbar.setLevels((0.0, 1.0))
        self._last_view = None
        self._fitted.clear()
        self.follow_range = True
        for plot in (self.gradient_norm, self.loss):
            plot.item.enableAutoRange(axis="y")

    def hide_hover(self) -> None:
        """No hover text left over data that changed (a load, a rewind)."""
        self.gradient_norm.hide_hover()
        self.loss.hide_hover()
        QToolTip.hideText()

    def show_statistic(self, statistic: str, history: RunHistory) -> None:
        """Show ``statistic`` (a built-in or one of ``history``'s named ones) in the
        gradient-norm plot, as its selector would (``gradscope open --statistic``)."""
        selector = self.gradient_norm.statistic_selector
        selector.offer(history)
        selector.choose(statistic)

    def auto_range(self) -> None:
        self.follow_range = True
        for plot in (self.gradient_norm, self.loss):
            plot.item.enableAutoRange(axis="y")
        if self._last_view is not None:
            self.refresh(self._last_view)
