"""A layers x steps heatmap of log10 gradient norm, NaN/Inf in red."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtWidgets import QToolTip, QVBoxLayout, QWidget

from gradscope.core.history import MISSING
from gradscope.gui.mixed_precision import (
    SKIPPED_WORDS,
    skipped_rows,
)
from gradscope.gui.plot_axes import LayerAxis
from gradscope.gui.plots.display_values import (
    HEATMAP_MAX_COLUMNS,
    finite_log_range,
    reduce_steps,
)
from gradscope.gui.plots.heatmap_colors import (
    SKIPPED_CELL,
    VIRIDIS,
    colorize,
    mark_skipped,
)
from gradscope.gui.plots.log_norm_cache import LogNormCache
from gradscope.gui.plots.plot_view import PlotView
from gradscope.gui.plots.plot_widget import LEFT_AXIS_WIDTH, make_plot_widget
from gradscope.gui.plots.statistic_choice import (
    DETAIL_ONLY,
    StatisticSelector,
)
from gradscope.gui.plots.step_zoom import StepZoomViewBox
from gradscope.gui.selection import Selection
from gradscope.gui.status_style import (
    format_value,
)


class HeatmapPlot(QWidget):
    """Layers (rows, forward order, top to bottom) by steps, coloured by log10 ‖grad‖."""

    selection_made = Signal(object)
    statistic_changed = Signal(str)

    def __init__(self, cache: LogNormCache | None = None) -> None:
        super().__init__()
        # Tells when the history went back (then everything is drawn afresh).
        self.cache = cache if cache is not None else LogNormCache()
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
        self.widget = make_plot_widget(
            "log10 ‖grad‖ (red: NaN/Inf, white: 0)",
            grid_x=False,
            grid_y=False,
            left=self.axis,
            view_box=StepZoomViewBox(fit_values=False),  # its rows are the layers
        )
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self.item = self.widget.getPlotItem()
        self.item.setLabel("bottom", "step")
        self.axis.setWidth(LEFT_AXIS_WIDTH)
        self.item.vb.invertY(True)
        self.image = pg.ImageItem(axisOrder="col-major")
        self.item.addItem(self.image)
        # Horizontal, under the step axis: the heatmap keeps the same width as the gradient
        # norm plot above it, so their linked step axes line up.
        self.colorbar = pg.ColorBarItem(
            values=(0, 1), colorMap=VIRIDIS, interactive=False, width=10, orientation="horizontal"
        )
        self.colorbar.setColorMap(VIRIDIS)
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
        self._steps_per_row = 1.0
        self.levels = (0.0, 1.0)
        self.rgba = np.zeros((0, 0, 4), dtype=np.uint8)
        self.statistic = "grad_norm"
        self.statistic_selector = StatisticSelector(self.widget)
        self.statistic_selector.statistic_chosen.connect(self._on_statistic_selector_chosen)
        scene = self.widget.scene()
        scene.sigMouseClicked.connect(self._on_scene_mouse_clicked)
        scene.sigMouseMoved.connect(self._on_scene_mouse_moved)

    def _on_statistic_selector_chosen(self, statistic: str) -> None:
        self.statistic = statistic
        self._key = None
        self._show_title()
        self.statistic_changed.emit(statistic)

    def _show_title(self) -> None:
        # Short, and clear of the statistic box over the top-left corner: the scaler's
        # words made it run off both sides of a 1280x800 window's heatmap (the hover and
        # the legends of the plots above say "skipped by the loss scaler" in full).
        self.item.setTitle(
            f"log10 {self.statistic_selector.label(self.statistic)} (red: NaN/Inf, white: 0"
            + (", purple: skipped)" if self._skipped_title else ")"),
            size="10pt",
            justify="right",
        )

    def refresh(self, view: PlotView) -> None:
        history = view.history
        self.statistic_selector.offer(history)
        order = view.ticked_layers()
        self._order = order
        self.axis.set_names(order)
        if not order or history.count == 0:
            self.image.clear()
            self._key = None
            if self._skipped_title:  # the last run's scaler is not this one's
                self._skipped_title = False
                self._show_title()
            return
        cache = self.cache
        cache.update(history)
        count = history.count
        columns = np.fromiter(
            (history.column(name) for name in order), dtype=np.intp, count=len(order)
        )
        per_row = max(1, math.ceil(count / HEATMAP_MAX_COLUMNS))
        key = (cache.resets, columns.tobytes(), per_row, self.statistic)
        if key != self._key:
            # Blocks of steps change with the number of steps (at most HEATMAP_MAX_COLUMNS
            # columns), or the layers changed: start over.
            self._key = key
            self._blocks = 0
            self._low_high = (math.inf, -math.inf)
            self._colored_levels = None
            self._colored_rows = 0
            self._shown = np.full((HEATMAP_MAX_COLUMNS + 1, len(order)), MISSING, dtype=np.float32)
            self._rgba = np.zeros((HEATMAP_MAX_COLUMNS + 1, len(order), 4), dtype=np.uint8)
        elif count == self._count:
            self.show_selection(view.selected_layer, view.selected_step)
            return
        self._count = count
        matrix = history.matrix(self.statistic)
        identity = np.array_equal(columns, np.arange(matrix.shape[1]))
        complete = count // per_row
        if complete > self._blocks:
            new = matrix[self._blocks * per_row : complete * per_row]
            new = new if identity else new[:, columns]
            new = mark_skipped(
                new, skipped_rows(history, self._blocks * per_row, complete * per_row)
            )
            reduced, _ = reduce_steps(new, limit=max(1, len(new) // per_row))
            self._shown[self._blocks : complete] = reduced
            self._low_high = finite_log_range(reduced, self._low_high)
            self._blocks = complete
        rows = complete
        low, high = self._low_high
        if count > complete * per_row:  # the last, incomplete block
            tail = matrix[complete * per_row : count]
            tail = tail if identity else tail[:, columns]
            tail = mark_skipped(tail, skipped_rows(history, complete * per_row, count))
            self._shown[complete] = tail.max(axis=0)
            low, high = finite_log_range(self._shown[complete : complete + 1], (low, high))
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
        self._rgba[first:rows] = colorize(matrix[first:rows], low, high)
        self._colored_levels, self._colored_rows = (low, high), complete
        self.rgba = self._rgba[:rows]
        # pyqtgraph (0.14) turns a one-layer image into a QImage of zero size (the swapped
        # axes of an (N, 1, 4) array give it a line stride of one pixel): the heatmap went
        # blank when one layer was watched. The row drawn twice fills the same rectangle.
        shown = np.repeat(self.rgba, 2, axis=1) if len(order) == 1 else self.rgba
        self.image.setImage(shown, autoLevels=False)
        first_step = self._steps[0]
        # Steps per history row: 1, except in a decimated recording (every k-th step and
        # the steps with events), whose image spans its steps, not its row count (it was
        # drawn over the first 3,295 steps of 6,000).
        self._steps_per_row = (self._steps[-1] - first_step + 1) / count
        width = rows * per_row * self._steps_per_row
        self.image.setRect(QRectF(first_step - 0.5, -0.5, max(width, 1), len(order)))
        self.colorbar.setLevels((low, high))
        skipped = bool(history.skipped[:count].any())
        if skipped != self._skipped_title:
            self._skipped_title = skipped
            self._show_title()
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
        row = math.floor((point.x() - self._steps[0] + 0.5) / self._steps_per_row)
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
        text = (
            (
                "not measured (no detail on this step)"
                if self.statistic in DETAIL_ONLY
                else "not measured (not due at this step)"
                if self.statistic_selector.points_only(self.statistic)
                else "not watched"
            )
            if value == MISSING
            else f"overflowed: {SKIPPED_WORDS}"
            if value == SKIPPED_CELL
            else f"{self.statistic_selector.label(self.statistic)} = {format_value(value)}"
        )
        global_pos = self.widget.mapToGlobal(self.widget.mapFromScene(scene_pos))
        QToolTip.showText(global_pos, f"{name or '(model)'}\nstep {step}\n{text}", self.widget)
