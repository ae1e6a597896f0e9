"""Gradient flow: one bar per layer at the selected step, coloured by status."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QBrush, QFont
from PySide6.QtWidgets import QToolTip, QVBoxLayout, QWidget

from gradscope.core.history import MISSING, STATUS_MISSING, RunHistory
from gradscope.gui.plot_axes import LayerAxis, elide
from gradscope.gui.plots.display_values import (
    log10_display,
)
from gradscope.gui.plots.plot_view import PlotView, classify_for_display
from gradscope.gui.plots.plot_widget import make_plot_widget
from gradscope.gui.plots.statistic_choice import (
    StatisticSelector,
)
from gradscope.gui.selection import Selection
from gradscope.gui.status_style import (
    STATUS_COLORS,
    format_value,
)

_STATUS_BRUSHES: dict[int, QBrush] = {}


def _status_brush(status: int) -> QBrush:
    brush = _STATUS_BRUSHES.get(status)
    if brush is None:
        brush = _STATUS_BRUSHES[status] = pg.mkBrush(STATUS_COLORS.get(status, "#7f7f7f"))
    return brush


# The threshold lines are named under the axis, in their colours: a name on the line was a
# box drawn over the bars.
_GRADIENT_AXIS_LABEL = (
    f"‖grad‖ <span style='color:{STATUS_COLORS[1]}'>┊ vanish</span> "
    f"<span style='color:{STATUS_COLORS[2]}'>┊ explode</span>"
)


class GradientFlowPlot(QWidget):
    """One horizontal bar per layer (rows shared with the heatmap) at the selected step."""

    selection_made = Signal(object)
    statistic_changed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        # Its rows are the heatmap's, which names them on its left: no second name column
        # (it took the chart's width at 1280x800 and cut its title and bars).
        self.axis = LayerAxis("left")
        self.axis.setStyle(showValues=False)
        self.axis.setWidth(8)
        self.widget = make_plot_widget("Gradient flow", grid_y=False, left=self.axis)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self.item = self.widget.getPlotItem()
        self.item.vb.invertY(True)
        self.item.getAxis("bottom").setLogMode(True)
        bottom = self.item.getAxis("bottom")
        bottom.label_at_start = True  # clear of the statistic box at the bottom right
        self.item.setLabel("bottom", _GRADIENT_AXIS_LABEL)
        self.bars = pg.BarGraphItem(x0=[], x1=[], y=[], height=0.72)
        self.item.addItem(self.bars)
        self.explode_line = pg.InfiniteLine(
            angle=90,
            pen=pg.mkPen(STATUS_COLORS[2], width=1.5, style=Qt.PenStyle.DashLine),
        )
        self.vanish_line = pg.InfiniteLine(
            angle=90,
            pen=pg.mkPen(STATUS_COLORS[1], width=1.5, style=Qt.PenStyle.DashLine),
        )
        for line in (self.explode_line, self.vanish_line):
            self.item.addItem(line)
        self.selected_box = pg.InfiniteLine(
            angle=0, pen=pg.mkPen("#000", width=1, style=Qt.PenStyle.DashLine)
        )
        self.selected_box.setVisible(False)
        self.item.addItem(self.selected_box, ignoreBounds=True)
        self._labels: list[pg.TextItem] = []
        # A name on each bar (the heatmap's names are far to the left, and the chart is
        # often read alone); one text item per layer, made when the layers change.
        self.name_labels: list[pg.TextItem] = []
        self._named_order: list[str] = []
        self.statistic = "grad_norm"
        self.statistic_selector = StatisticSelector(self.widget, bottom_right=True)
        self.statistic_selector.statistic_chosen.connect(self._on_statistic_selector_chosen)
        self.item.vb.sigResized.connect(self._thin_name_labels)
        self.item.vb.sigYRangeChanged.connect(self._thin_name_labels)
        self._order: list[str] = []
        self._values = np.zeros(0)
        self.step: int | None = None
        self.widget.scene().sigMouseClicked.connect(self._on_scene_mouse_clicked)
        self.widget.scene().sigMouseMoved.connect(self._on_scene_mouse_moved)

    def _on_statistic_selector_chosen(self, statistic: str) -> None:
        self.statistic = statistic
        self.item.setLabel(
            "bottom",
            _GRADIENT_AXIS_LABEL
            if statistic == "grad_norm"
            else self.statistic_selector.label(statistic),
        )
        self.statistic_changed.emit(statistic)

    def _row_of(self, history: RunHistory, step: int | None) -> int | None:
        """The history row shown: the selected step's (else the last); for a statistic
        measured on detail steps only, the last detail row at or before it."""
        row = (
            history.row_of_step(step)
            if step is not None
            else (history.count - 1 if history.count else None)
        )
        if row is None or not self.statistic_selector.points_only(self.statistic):
            return row
        measured = np.flatnonzero((history.matrix(self.statistic)[: row + 1] != MISSING).any(1))
        return int(measured[-1]) if len(measured) else None

    def _update_name_labels(self, order: list[str]) -> None:
        if order == self._named_order:
            return
        for label in self.name_labels:
            self.item.removeItem(label)
        font = QFont()
        font.setPointSize(7)
        self.name_labels = []
        for i, name in enumerate(order):
            # Over the bars: a pale backing keeps the name readable on any bar colour.
            label = pg.TextItem(
                elide(name or "(model)", 26),
                color="#111",
                anchor=(0, 0.5),
                fill=pg.mkBrush(255, 255, 255, 150),
            )
            label.setFont(font)
            label.textItem.document().setDocumentMargin(1)  # a tight box: more names fit
            label.setZValue(5)
            label.setPos(0, i)
            self.item.addItem(label, ignoreBounds=True)
            self.name_labels.append(label)
        self._named_order = list(order)
        self._thin_name_labels()

    def _thin_name_labels(self, *_: object) -> None:
        """Every bar named while the rows are tall enough for a line of text; denser, every
        k-th (hovering names the others)."""
        if not self.name_labels:
            return
        (_, _), (low, high) = self.item.vb.viewRange()
        row_pixels = self.item.vb.height() / max(high - low, 1e-9)
        # Each shown name's whole box clear of the next one's (at 11 px a row they
        # overlapped: hf:bert's 104 names were a black smear).
        label_pixels = self.name_labels[0].boundingRect().height() + 1
        stride = max(1, math.ceil(label_pixels / max(row_pixels, 0.1)))
        for i, label in enumerate(self.name_labels):
            label.setVisible(i % stride == 0)

    def refresh(self, view: PlotView) -> None:
        history = view.history
        self.statistic_selector.offer(history)
        order = view.ticked_layers()
        self._order = order
        self.axis.set_names(order)
        for label in self._labels:
            self.item.removeItem(label)
        self._labels = []
        self.explode_line.setValue(
            math.log10(view.explode_threshold) if view.explode_threshold > 0 else 0
        )
        self.vanish_line.setVisible(view.vanish_threshold > 0)
        if view.vanish_threshold > 0:
            self.vanish_line.setValue(math.log10(view.vanish_threshold))
        self._update_name_labels(order)
        walked = view.flow is not None and self.statistic == "grad_norm"
        gradient = self.statistic == "grad_norm"
        self.explode_line.setVisible(gradient)
        self.vanish_line.setVisible(gradient and view.vanish_threshold > 0)
        row = self._row_of(history, view.selected_step)
        if row is None or not order:
            self.bars.setOpts(x0=[], x1=[], y=[], brushes=[])
            self.widget.setTitle("Gradient flow", size="10pt")
            self._values = np.zeros(0)
            return
        self.step = int(history.steps[row])
        title = f"Gradient flow at step {self.step}"
        if not gradient:
            title = f"{self.statistic_selector.label(self.statistic)} at step {self.step}"
            if view.selected_step is not None and view.selected_step != self.step:
                title += " (last measured)"
        self.widget.setTitle(view.flow_title if walked else title, size="10pt")
        columns = [history.column(name) for name in order]
        values = history.matrix(self.statistic)[row, columns].astype(np.float64)
        status = history.status_matrix()[row, columns]
        if walked:
            values = np.array([view.flow.get(name, MISSING) for name in order])
            status = np.array([classify_for_display(v, view) for v in values], dtype=np.uint8)
        self._values = values
        logged = log10_display(values)
        finite = np.isfinite(logged)
        thresholds = [
            math.log10(t)
            for t in (view.explode_threshold, view.vanish_threshold)
            if t > 0 and gradient
        ]
        if not finite.any() and not thresholds:
            thresholds = [0.0]
        low = min([*logged[finite].tolist(), *thresholds]) - 1
        high = max([*logged[finite].tolist(), *thresholds]) + 1
        x0, x1, ys, brushes = [], [], [], []
        for i, (value, log_value) in enumerate(zip(values, logged, strict=True)):
            if value == MISSING or status[i] == STATUS_MISSING:
                continue
            if not math.isfinite(value):
                end = high
                label = pg.TextItem(
                    "NaN" if math.isnan(value) else "Inf", color="w", anchor=(1, 0.5)
                )
                font = QFont()  # the app's sans-serif (an empty family gave a serif)
                font.setPointSize(9)
                font.setBold(True)
                label.setFont(font)
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
            self.bars.setOpts(
                x0=x0, x1=x1, y=ys, height=0.72, brushes=brushes, pens=[pg.mkPen(None)] * len(ys)
            )
        else:  # pyqtgraph's BarGraphItem fails on an empty pens list
            self.bars.setOpts(x0=[], x1=[], y=[], brushes=[])
        for label in self.name_labels:
            label.setPos(low, label.pos().y())
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
        label = self.statistic_selector.label(self.statistic)
        text = "not watched" if value == MISSING else f"{label} = {format_value(value)}"
        global_pos = self.widget.mapToGlobal(self.widget.mapFromScene(scene_pos))
        QToolTip.showText(
            global_pos, f"{self._order[i] or '(model)'}\nstep {self.step}\n{text}", self.widget
        )
