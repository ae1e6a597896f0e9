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
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import QSplitter, QToolTip, QVBoxLayout, QWidget

from gradscope.core.history import MISSING, STATUS_MISSING, RunHistory
from gradscope.core.watch import classify
from gradscope.gui.selection import Selection
from gradscope.gui.status_style import (
    NONFINITE_MARKER_COLOR,
    STATUS_COLORS,
    ZERO_MARKER_COLOR,
    format_value,
)

_HOVER_PIXELS = 9
_LEGEND_MAX = 12
HEATMAP_MAX_COLUMNS = 2000
_DOTS_UP_TO = 40
_EDGE_LEGEND = "\x00edge"
_LEFT_AXIS_WIDTH = 64
_MISSING_COLOR = (236, 236, 236, 255)
_NONFINITE_RGBA = (214, 39, 40, 255)
_VIRIDIS = pg.colormap.get("viridis")


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


# Distinct colours for the first layers, without the status red and orange (those mean
# NaN/Inf and exploding everywhere in the app); later layers cycle through hues.
_LAYER_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                  "#bcbd22", "#7f7f7f", "#393b79", "#637939")


def layer_color(position: int) -> QColor:
    if position < len(_LAYER_PALETTE):
        return QColor(_LAYER_PALETTE[position])
    return pg.intColor(position, hues=13, values=2, maxValue=220, minValue=140)


def _elide(name: str, limit: int = 26) -> str:
    name = name or "(model)"
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


class LayerAxis(pg.AxisItem):
    """Layer names at integer positions, thinned so that labels never overlap."""

    def __init__(self, orientation: str = "left") -> None:
        super().__init__(orientation)
        self.names: list[str] = []
        self.setStyle(tickFont=QFont("", 8))

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list:
        if not self.names:
            return []
        low = max(0, math.ceil(min(minVal, maxVal)))
        high = min(len(self.names) - 1, math.floor(max(minVal, maxVal)))
        if high < low:
            return []
        visible = high - low + 1
        step = max(1, math.ceil(visible * 15 / max(size, 1)))
        return [(float(step), list(range(low, high + 1, step)))]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        out = []
        for value in values:
            i = round(value)
            out.append(_elide(self.names[i]) if 0 <= i < len(self.names) else "")
        return out


def _plot_widget(title: str) -> pg.PlotWidget:
    widget = pg.PlotWidget()
    widget.setTitle(title, size="10pt")
    item = widget.getPlotItem()
    item.showGrid(x=True, y=True, alpha=0.15)
    item.setMenuEnabled(True)
    item.hideButtons()
    for name in ("left", "bottom"):
        item.getAxis(name).enableAutoSIPrefix(False)
    widget.setMinimumSize(200, 150)
    return widget


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
        self.legend = pg.LegendItem(offset=(10, 24), labelTextSize="8pt")
        self.legend.setParentItem(self.item.vb)
        self.legend.setBrush(pg.mkBrush(255, 255, 255, 205))
        self.legend.setPen(pg.mkPen(200, 200, 200))
        self._legend_names: list[str] = []
        self.curves: dict[str, pg.PlotDataItem] = {}
        self._log: dict[str, np.ndarray] = {}
        self._raw: dict[str, np.ndarray] = {}
        self._steps = np.zeros(0)
        self._visible: list[str] = []
        self._edge_points: list[tuple[str, int, float, bool]] = []  # layer, step, value, top
        self.markers = pg.ScatterPlotItem(size=13, pxMode=True, symbol="x",
                                          brush=pg.mkBrush(NONFINITE_MARKER_COLOR),
                                          pen=pg.mkPen(NONFINITE_MARKER_COLOR, width=2.5))
        self.markers.setZValue(20)
        self.item.addItem(self.markers, ignoreBounds=True)
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
        self.item.vb.sigRangeChanged.connect(self._place_markers)
        scene = self.widget.scene()
        scene.sigMouseMoved.connect(self._on_scene_mouse_moved)
        scene.sigMouseClicked.connect(self._on_scene_mouse_clicked)

    # -- drawing -------------------------------------------------------------------------
    def refresh(self, view: PlotView) -> None:
        history = view.history
        self._steps = history.steps.astype(np.float64)
        visible = [name for name in view.order if name in view.visible and history.has_layer(name)]
        edge_points: list[tuple[str, int, float, bool]] = []
        for name in view.order:
            if not history.has_layer(name):
                continue
            curve = self.curves.get(name)
            color = view.colors.get(name, QColor("#1f77b4"))
            if curve is None:
                curve = pg.PlotDataItem(name=name or "(model)", connect="finite",
                                         autoDownsampleFactor=1.0)
                curve.setPen(pg.mkPen(color, width=1))
                self.item.addItem(curve)
                self.curves[name] = curve
            shown = name in view.visible
            curve.setVisible(shown)
            if not shown:
                continue
            raw = history.series("grad_norm", name)
            logged = log10_display(raw)
            self._raw[name], self._log[name] = raw, logged
            few = len(self._steps) <= _DOTS_UP_TO and bool(np.isfinite(logged).any())
            curve.setData(self._steps, logged, connect="finite", symbol="o" if few else None,
                          symbolSize=4, symbolBrush=color, symbolPen=None)
            nonfinite = np.flatnonzero(~np.isfinite(raw))
            zeros = np.flatnonzero(raw == 0)
            edge_points.extend((name, int(self._steps[i]), float(raw[i]), True) for i in nonfinite)
            edge_points.extend((name, int(self._steps[i]), 0.0, False) for i in zeros)
        for name, curve in self.curves.items():
            if not history.has_layer(name):
                curve.setVisible(False)
        self._edge_points = edge_points
        self._visible = visible
        self._update_legend(visible)
        self.show_selection(view.selected_layer, view.selected_step)
        self._place_markers()

    def _update_legend(self, visible: list[str]) -> None:
        shown = visible[:_LEGEND_MAX] if len(visible) <= _LEGEND_MAX else []
        if self._edge_points:
            shown = [*shown, _EDGE_LEGEND]
        if shown == self._legend_names:
            return
        self.legend.clear()
        for name in shown:
            if name == _EDGE_LEGEND:
                self.legend.addItem(self.markers, "NaN/Inf (top edge), 0 (bottom)")
            else:
                self.legend.addItem(self.curves[name], _elide(name, 30))
        self._legend_names = shown
        self.legend.setVisible(bool(shown))

    def show_selection(self, layer: str | None, step: int | None) -> None:
        for name, curve in self.curves.items():
            pen = curve.opts["pen"]
            color = pg.mkPen(pen).color()
            # Qt strokes antialiased pens wider than 1 px very slowly (seconds for a
            # 10,000-point curve), so only the one highlighted curve is wide, and not
            # antialiased.
            selected = name == layer
            curve.setPen(pg.mkPen(color, width=2.6 if selected else 1))
            curve.opts["antialias"] = not selected
            curve.curve.opts["antialias"] = not selected
            curve.setZValue(10 if name == layer else 0)
        self.step_line.setVisible(step is not None)
        if step is not None:
            self.step_line.setValue(step)

    def _place_markers(self, *_: object) -> None:
        if not self._edge_points:
            self.markers.setData([])
            return
        (_, _), (bottom, top) = self.item.vb.viewRange()
        _, pixel_height = self.item.vb.viewPixelSize()
        top_y = top - 8 * pixel_height
        bottom_y = bottom + 8 * pixel_height
        spots = []
        for name, step, value, at_top in self._edge_points:
            nan = isinstance(value, float) and math.isnan(value)
            spots.append({
                "pos": (step, top_y if at_top else bottom_y),
                "symbol": "x" if nan else ("t1" if at_top else "t"),
                "brush": pg.mkBrush(NONFINITE_MARKER_COLOR if at_top else ZERO_MARKER_COLOR),
                "pen": pg.mkPen(NONFINITE_MARKER_COLOR if at_top else ZERO_MARKER_COLOR,
                                width=2.5 if nan else 1),
                "data": (name, step, value),
            })
        self.markers.setData(spots)

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
        if abs(self._steps[row] - point.x()) / pixel_width <= _HOVER_PIXELS * 3:
            for name in self._visible:
                y = self._log[name][row]
                if not np.isfinite(y):
                    continue
                dx = (self._steps[row] - point.x()) / pixel_width
                dy = (y - point.y()) / pixel_height
                distance = math.hypot(dx, dy)
                if distance <= _HOVER_PIXELS * 1.5 and (best is None or distance < best[0]):
                    best = (distance, (name, int(self._steps[row]), float(self._raw[name][row])))
        return best[1] if best else None

    def _on_scene_mouse_moved(self, scene_pos: QPointF) -> None:
        found = self.nearest(scene_pos)
        if found is None:
            self.hover.setVisible(False)
            self.hover_text = ""
            return
        name, step, value = found
        self.hover_text = f"{name or '(model)'}\nstep {step}\n‖grad‖ = {format_value(value)}"
        self.hover.setText(self.hover_text)
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
        self.show_selection(view.selected_step)
        self._place_markers()

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

    def __init__(self) -> None:
        super().__init__()
        self.widget = pg.PlotWidget()
        self.widget.setTitle("log10 gradient norm, layers × steps (red: NaN/Inf)", size="10pt")
        self.widget.setMinimumSize(200, 150)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self.item = self.widget.getPlotItem()
        self.item.hideButtons()
        self.item.setLabel("bottom", "step")
        self.item.setLabel("left", "layer (forward order)")
        self.item.getAxis("left").setStyle(showValues=False)
        self.item.getAxis("left").setWidth(_LEFT_AXIS_WIDTH)
        self.item.getAxis("bottom").enableAutoSIPrefix(False)
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
        if not order or history.count == 0:
            self.image.clear()
            return
        columns = [history.column(name) for name in order]
        matrix, self.steps_per_column = reduce_steps(history.matrix("grad_norm")[:, columns])
        self._matrix = matrix
        self._steps = history.steps.astype(np.float64)
        logged = log10_display(matrix)
        finite = np.isfinite(logged)
        if finite.any():
            low, high = float(logged[finite].min()), float(logged[finite].max())
        else:
            low, high = 0.0, 1.0
        if high - low < 1e-6:
            low, high = low - 0.5, high + 0.5
        self.levels = (low, high)
        lut = _VIRIDIS.getLookupTable(0.0, 1.0, 256, alpha=True)
        scaled = np.clip((np.nan_to_num(logged, nan=low) - low) / (high - low), 0, 1)
        rgba = lut[(scaled * 255).astype(np.intp)]
        rgba[matrix == 0] = lut[0]
        rgba[matrix == MISSING] = _MISSING_COLOR
        rgba[~np.isfinite(matrix)] = _NONFINITE_RGBA
        self.rgba = rgba
        self.image.setImage(rgba, autoLevels=False)
        first = self._steps[0]
        width = len(matrix) * self.steps_per_column
        self.image.setRect(QRectF(first - 0.5, -0.5, max(width, 1), len(order)))
        self.colorbar.setLevels((low, high))
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
        text = "not watched" if value == MISSING else f"‖grad‖ = {format_value(value)}"
        global_pos = self.widget.mapToGlobal(self.widget.mapFromScene(scene_pos))
        QToolTip.showText(global_pos, f"{name or '(model)'}\nstep {step}\n{text}", self.widget)


class GradientFlowPlot(QWidget):
    """One horizontal bar per layer (rows shared with the heatmap) at the selected step."""

    selection_made = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.axis = LayerAxis("left")
        self.widget = pg.PlotWidget(axisItems={"left": self.axis})
        self.widget.setTitle("Gradient flow", size="10pt")
        self.widget.setMinimumSize(200, 150)
        self.widget.getPlotItem().showGrid(x=True, y=False, alpha=0.15)
        self.widget.getPlotItem().hideButtons()
        self.widget.getPlotItem().getAxis("bottom").enableAutoSIPrefix(False)
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
            brushes.append(pg.mkBrush(STATUS_COLORS.get(int(status[i]), "#7f7f7f")))
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
        self.heatmap = HeatmapPlot()
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
        # Linked views turn each other's auto-range off, so the shared step axis and layer
        # rows are ranged here, until the user zooms or pans (View > Reset plot zoom).
        self.follow_range = True

    def _on_view_range_changed_manually(self, *_: object) -> None:
        self.follow_range = False

    def refresh(self, view: PlotView) -> None:
        self._last_view = view
        self.gradient_norm.refresh(view)
        self.loss.refresh(view)
        self.heatmap.refresh(view)
        self.flow.refresh(view)
        if self.follow_range:
            self._fit_shared_axes(view)

    def _fit_shared_axes(self, view: PlotView) -> None:
        history = view.history
        if history.count:
            first, last = float(history.steps[0]), float(history.steps[-1])
            # At least ten steps wide, so that a short run has whole-step ticks.
            last = max(last, first + 9)
            self.gradient_norm.item.setXRange(first - 0.5, last + 0.5, padding=0.02)
        layers = sum(1 for name in view.order if history.has_layer(name))
        if layers:
            self.heatmap.item.setYRange(-0.5, layers - 0.5, padding=0)

    def show_selection(self, layer: str | None, step: int | None) -> None:
        self.gradient_norm.show_selection(layer, step)
        self.loss.show_selection(step)
        self.heatmap.show_selection(layer, step)
        if self._last_view is not None:
            self._last_view.selected_layer = layer
            self._last_view.selected_step = step
            self.flow.refresh(self._last_view)

    def clear(self) -> None:
        for curve in self.gradient_norm.curves.values():
            self.gradient_norm.item.removeItem(curve)
        self.gradient_norm.curves.clear()
        self.gradient_norm._legend_names = ["-"]
        self._last_view = None

    def auto_range(self) -> None:
        self.follow_range = True
        for plot in (self.gradient_norm, self.loss):
            plot.item.enableAutoRange(axis="y")
        if self._last_view is not None:
            self.refresh(self._last_view)
