"""The loss against step, log y when it spans orders of magnitude."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtWidgets import QComboBox, QVBoxLayout

from gradscope.gui.mixed_precision import (
    SKIPPED_WORDS,
    LossScaleAxis,
    SkippedMarkers,
)
from gradscope.gui.plot_axes import elapsed_text, elide
from gradscope.gui.plots.compared_markers import (
    ComparedMarkers,
    compared_origin_words,
    loss_marks,
)
from gradscope.gui.plots.compared_runs import LINE_STYLE_WORDS, ComparedRun, short_run_name
from gradscope.gui.plots.display_values import ema_display, log10_display
from gradscope.gui.plots.hover_label import HoverLabelPlot
from gradscope.gui.plots.plot_view import PlotView
from gradscope.gui.plots.plot_widget import DOTS_UP_TO, make_plot_widget
from gradscope.gui.plots.step_zoom import StepZoomViewBox
from gradscope.gui.selection import Selection
from gradscope.gui.status_style import (
    NONFINITE_MARKER_COLOR,
    format_value,
)

_HOVER_PIXELS = 12  # how far (across the steps) the mouse may be from a step it reads


class LossPlot(HoverLabelPlot):
    selection_made = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.widget = make_plot_widget("Loss", view_box=StepZoomViewBox())
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
        # With smoothing: the raw loss faint behind the smoothed curve.
        self.smoothing = 0.0
        self.raw_curve = pg.PlotDataItem(pen=pg.mkPen(51, 51, 51, 60, width=1), connect="finite")
        self.raw_curve.setZValue(-5)
        self.raw_curve.setVisible(False)
        self.item.addItem(self.raw_curve)
        self.markers = pg.ScatterPlotItem(
            size=11, symbol="x", pen=pg.mkPen(NONFINITE_MARKER_COLOR, width=2.5)
        )
        self.item.addItem(self.markers, ignoreBounds=True)
        self.skipped = SkippedMarkers(self.item, pinned=False)
        self.loss_scale = LossScaleAxis(self.item)
        # Under the step axis, only while there is a scaler to explain.
        self.legend = pg.LegendItem(labelTextSize="8pt", colCount=1, verSpacing=-6)
        self.item.layout.addItem(self.legend, 4, 1)
        self.legend.setVisible(False)
        self._legend_key: tuple = (False, False, ())
        # The compared runs' origin entries of the legend: a click selects that origin's
        # layer and step (its module, in the shown run's tree).
        self._origin_entries: list[tuple[pg.PlotDataItem, object]] = []
        # The run legend (with runs compared): this plot draws every run's loss in its
        # line style, so the styles are explained here, beside the curves they name.
        self._runs: tuple[str, tuple[ComparedRun, ...], list[str]] = ("", (), [])
        self.step_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#555", style=Qt.PenStyle.DashLine))
        self.step_line.setVisible(False)
        self.item.addItem(self.step_line, ignoreBounds=True)
        self._nonfinite_steps = np.zeros(0)
        self._log = False
        self.item.vb.sigRangeChanged.connect(self._place_markers)
        self.widget.scene().sigMouseClicked.connect(self._on_scene_mouse_clicked)
        self._steps = np.zeros(0)
        self._x = np.zeros(0)  # where each step is drawn (its number, or its time)
        self.wall_clock = False
        self.compared_curves: dict[str, pg.PlotDataItem] = {}  # run name -> its loss
        self.compared_marks = ComparedMarkers(self.item)
        self._compared_marks_key: tuple | None = None
        # The value axis: auto (log when the loss spans orders of magnitude), log, linear.
        self.scale_choice = QComboBox(self.widget)
        self.scale_choice.addItems(["auto", "log", "linear"])
        self.scale_choice.setToolTip("The loss axis: auto (log when it spans 20x), log, linear")
        font = self.scale_choice.font()
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        self.scale_choice.setFont(font)
        self.scale_choice.adjustSize()
        self.scale_choice.move(2, 2)
        self.scale_choice.currentIndexChanged.connect(self._on_scale_choice_changed)
        self._last_view: PlotView | None = None
        # The readout the other plots have: the step under the mouse, its loss and each
        # compared run's loss at that step.
        self.hover = pg.TextItem(
            anchor=(0, 1), color="#111", fill=pg.mkBrush(255, 255, 230, 235), border="#999"
        )
        self.hover.setZValue(50)
        self.hover.setVisible(False)
        self.item.addItem(self.hover, ignoreBounds=True)
        self.hover_text = ""
        self.widget.scene().sigMouseMoved.connect(self._on_scene_mouse_moved)
        self.widget.viewport().installEventFilter(self)

    def _on_scale_choice_changed(self, _index: int) -> None:
        if self._last_view is not None:
            self.item.enableAutoRange(axis="y")
            self.refresh(self._last_view)

    def set_wall_clock(self, wall_clock: bool) -> None:
        """Steps at their wall-clock time (seconds since the run's first step)."""
        self.wall_clock = wall_clock
        self.item.getAxis("bottom").set_time_ticks(wall_clock)
        self.item.setLabel("bottom", "time since the first step" if wall_clock else "step")

    def _x_of(self, history) -> np.ndarray:
        if self.wall_clock:
            return history.elapsed_seconds()
        return history.steps.astype(np.float64)

    def refresh(self, view: PlotView) -> None:
        self._last_view = view
        steps = view.history.steps.astype(np.float64)
        x = self._x_of(view.history)
        loss = view.history.losses
        finite = np.isfinite(loss)
        # Log scale only when the loss spans orders of magnitude (a narrow range would get
        # one or two ticks).
        positive = loss[finite]
        use_log = bool(
            positive.size and (positive > 0).all() and positive.max() / positive.min() >= 20
        )
        chosen = self.scale_choice.currentText()
        if chosen != "auto":
            use_log = chosen == "log"
        if use_log != self._log:
            self._log = use_log
            self.item.getAxis("left").setLogMode(use_log)
            self.item.setLabel("left", "loss" + (" (log)" if use_log else ""))
        y = log10_display(loss) if use_log else np.where(finite, loss, np.nan)
        self.raw_curve.setVisible(self.smoothing > 0)
        if self.smoothing > 0:
            self.raw_curve.setData(x, y, connect="finite")
            y = ema_display(y, self.smoothing)
        # Dots while there are few steps: a single step has no line to draw.
        few = len(steps) <= DOTS_UP_TO and bool(np.isfinite(y).any())
        self.curve.setData(
            x,
            y,
            connect="finite",
            symbol="o" if few else None,
            symbolSize=5,
            symbolBrush="#333",
            symbolPen=None,
        )
        self._steps = steps
        self._x = x
        self._nonfinite_steps = x[~finite]  # where they are drawn
        self._update_compared(view.compared)
        ticked = [n for n in view.order if n in view.visible and view.history.has_layer(n)]
        self._runs = (view.run_name, view.compared, ticked)
        self.skipped.refresh(view.history, y, x=x)
        self.loss_scale.refresh(view.history, x=x)
        self._update_legend()
        self.show_selection(view.selected_step)
        self._place_markers()

    def _update_compared(self, compared: tuple[ComparedRun, ...]) -> None:
        """Each compared run's loss in its line style, on this plot's scale."""
        names = {run.name for run in compared}
        for name in [n for n in self.compared_curves if n not in names]:
            self.item.removeItem(self.compared_curves.pop(name))
        for run in compared:
            curve = self.compared_curves.get(run.name)
            if curve is None:
                curve = self.compared_curves[run.name] = pg.PlotDataItem(connect="finite")
                self.item.addItem(curve)
            loss = run.history.losses
            y = log10_display(loss) if self._log else np.where(np.isfinite(loss), loss, np.nan)
            curve.setData(
                self._x_of(run.history),
                y,
                connect="finite",
                pen=pg.mkPen("#333", width=1.2, style=run.line_style),
            )
        key = (
            tuple((run.name, id(run.history), run.history.count) for run in compared),
            self.wall_clock,
        )
        if key != self._compared_marks_key:
            self._compared_marks_key = key
            self.compared_marks.refresh(
                tuple(loss_marks(run, self._x_of(run.history)) for run in compared)
            )

    def _update_legend(self) -> None:
        run_name, compared, ticked = self._runs
        runs = tuple(
            (
                run.name,
                run.line_style,
                tuple(run.missing_layers(ticked)),
                compared_origin_words(run),
            )
            for run in compared
        )
        key = (bool(len(self.skipped.steps)), self.loss_scale.shown, runs and (run_name, runs))
        if key == self._legend_key:
            return
        self._legend_key = key
        self.legend.clear()
        self._origin_entries = []
        if key[0]:
            self.legend.addItem(self.skipped.markers, SKIPPED_WORDS)
        if key[1]:
            self.legend.addItem(self.loss_scale.curve, "loss scale (right, log)")
        if runs:
            self._add_run_legend(run_name, compared, ticked)
        self.legend.setVisible(any(key))

    def _add_run_legend(
        self, run_name: str, compared: tuple[ComparedRun, ...], ticked: list[str]
    ) -> None:
        """One entry per run: its line style (in every plot), and the ticked layers it does
        not have."""
        grey = "#333"
        self.legend.addItem(
            pg.PlotDataItem(pen=pg.mkPen(grey, width=1.5)),
            f"{short_run_name(run_name or 'shown run')} (solid)",
        )
        for run in compared:
            text = f"{short_run_name(run.name)} ({LINE_STYLE_WORDS[run.line_style]})"
            self.legend.addItem(
                pg.PlotDataItem(pen=pg.mkPen(grey, width=1.5, style=run.line_style)), text
            )
            missing = run.missing_layers(ticked)
            if missing:  # a line of its own: the plot is narrow
                names = elide(", ".join(n or "(model)" for n in missing), 20)
                self.legend.addItem(pg.PlotDataItem(pen=None), f"missing: {names}")
            origin = run.history.first_nonfinite
            if origin is not None:  # the run's own origin: where, above the Events list
                # (Short: a wider legend widened the plot past its view at 1280x800.)
                sample = pg.PlotDataItem(pen=None)
                self.legend.addItem(sample, f"NaN/Inf from step {origin.step} ▸")
                self._origin_entries.append((sample, origin))

    def show_selection(self, step: int | None) -> None:
        self.step_line.setVisible(step is not None)
        if step is not None:
            if self.wall_clock and len(self._steps):
                row = min(int(np.searchsorted(self._steps, step)), len(self._steps) - 1)
                self.step_line.setValue(float(self._x[row]))
            else:
                self.step_line.setValue(step)

    def _place_markers(self, *_: object) -> None:
        if not len(self._nonfinite_steps):
            self.markers.setData([])
            return
        (_, _), (_, top) = self.item.vb.viewRange()
        _, pixel_height = self.item.vb.viewPixelSize()
        self.markers.setData(
            self._nonfinite_steps, np.full(len(self._nonfinite_steps), top - 8 * pixel_height)
        )

    def readout(self, scene_pos: QPointF) -> str:
        """What the mouse at ``scene_pos`` points at: the nearest step's loss (within a few
        pixels), and each compared run's loss at that step; "" when no step is near."""
        vb = self.item.vb
        if not vb.sceneBoundingRect().contains(scene_pos) or not len(self._steps):
            return ""
        x = vb.mapSceneToView(scene_pos).x()
        pixel_width, _ = vb.viewPixelSize()
        row = int(np.argmin(np.abs(self._x - x)))
        if abs(self._x[row] - x) > _HOVER_PIXELS * pixel_width:
            return ""
        history = self._last_view.history if self._last_view is not None else None
        if history is None or row >= history.count:
            return ""
        step = int(self._steps[row])
        when = f"step {step}"
        if self.wall_clock:
            when += f" · {elapsed_text(float(self._x[row]))} after the first step"
        lines = [when, f"loss = {self._loss_words(history, row)}"]
        for run in self._last_view.compared:
            other = run.history.row_of_step(step)
            if other is not None:
                name = short_run_name(run.name)
                lines.append(f"{name}: {self._loss_words(run.history, other)}")
        return "\n".join(lines)

    @staticmethod
    def _loss_words(history: object, row: int) -> str:
        value = float(history.losses[row])
        if bool(history.skipped[row]):
            return f"{format_value(value)} ({SKIPPED_WORDS})"
        return format_value(value)

    def _on_scene_mouse_moved(self, scene_pos: QPointF) -> None:
        text = self.readout(scene_pos)
        if not text:
            self.hide_hover()
            return
        self.hover_text = text
        self.hover.setText(text)
        rect = self.item.vb.sceneBoundingRect()
        right = scene_pos.x() > rect.left() + rect.width() * 0.6
        upper = scene_pos.y() < rect.top() + rect.height() * 0.4
        self.hover.setAnchor((1 if right else 0, 0 if upper else 1))
        self.hover.setPos(self.item.vb.mapSceneToView(scene_pos))
        self.hover.setVisible(True)

    def _on_scene_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        for sample, label in self.legend.items if self.legend.isVisible() else ():
            origin = next(
                (o for s, o in self._origin_entries if s is getattr(sample, "item", sample)), None
            )
            if origin is not None and label.sceneBoundingRect().contains(event.scenePos()):
                self.selection_made.emit(Selection(origin.module, origin.step))
                event.accept()
                return
        if not len(self._steps):
            return
        if not self.item.vb.sceneBoundingRect().contains(event.scenePos()):
            return
        x = self.item.vb.mapSceneToView(event.scenePos()).x()
        row = int(np.argmin(np.abs(self._x - x)))
        self.selection_made.emit(Selection(None, int(self._steps[row])))
