"""Many layers' lines drawn as one image (issue 17, zoom): the image shows what Qt's line
segments showed, and a zoom or pan still shows every layer's extremes and NaN markers."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QLineF
from PySide6.QtGui import QColor, QImage, QPainter, QPen

from gradscope.gui.peak_raster import line_runs, rasterize


def _qt_lines(x: np.ndarray, low: np.ndarray, high: np.ndarray, width: int, height: int):
    """What the grouped curves drew before: per layer the polyline (x, low), (x, high),
    (next x, next low)..., as aliased 1 px segments, none across a NaN."""
    image = QImage(width, height, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(0)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)
    painter.setPen(QPen(QColor("red"), 1))
    segments = []
    for layer in range(low.shape[0]):
        xs = np.repeat(x, 2)
        ys = np.stack([low[layer], high[layer]], axis=1).ravel()
        for i in range(len(xs) - 1):
            if np.isfinite(ys[i]) and np.isfinite(ys[i + 1]):
                segments.append(QLineF(xs[i], ys[i], xs[i + 1], ys[i + 1]))
    painter.drawLines(segments)
    painter.end()
    pixels = np.frombuffer(image.constBits(), dtype=np.uint32).reshape(height, width)
    return pixels != 0


def _grown(mask: np.ndarray) -> np.ndarray:
    """``mask`` and its eight neighbours."""
    rows = mask.copy()
    rows[1:] |= mask[:-1]
    rows[:-1] |= mask[1:]
    grown = rows.copy()
    grown[:, 1:] |= rows[:, :-1]
    grown[:, :-1] |= rows[:, 1:]
    return grown


@pytest.mark.parametrize("spacing", [1.0, 1.3, 2.0, 4.7, 13.0])
def test_the_image_shows_the_pixels_of_qts_line_segments(spacing: float) -> None:
    # Points a pixel or more apart (peak blocks at zoomed-out views, single steps zoomed
    # in), lines breaking at NaN: every pixel Qt drew has an image pixel next to it, and
    # the image draws nothing that is not next to one of Qt's.
    width, height, layers = 200, 150, 5
    count = int(width / spacing) + 2
    rng = np.random.default_rng(1)
    x = np.arange(count) * spacing - 1.7
    low = height / 2 + 40 * np.sin(np.arange(count) / 7 + np.arange(layers)[:, None])
    high = low - rng.uniform(0, 15, (layers, count))
    low[1, 10:13] = high[1, 10:13] = np.nan
    drawn = (
        rasterize(
            x, low.astype(np.float32), high.astype(np.float32), np.ones(layers), width, height
        )
        > 0
    )
    qt = _qt_lines(x, low, high, width, height)
    assert qt.sum() > 1000
    assert not (qt & ~_grown(drawn)).any()
    assert not (drawn & ~_grown(qt)).any()
    # The lines cover at least as much as Qt's, give or take 10% (at most one pixel more
    # per column of a run, or one less at its joins).
    assert 0.9 < drawn.sum() / qt.sum() < 1.1


def test_a_nan_breaks_the_line_and_the_later_colour_is_drawn_over_the_earlier() -> None:
    x = np.arange(0, 100, 5.0)
    flat = np.full((2, len(x)), 40.0, dtype=np.float32)
    flat[0, 8] = np.nan  # layer 0: no value at x = 40
    indices = rasterize(x, flat, flat, np.array([1, 2]), 100, 80)
    # Both lines on row 40: layer 1 (colour 2) over layer 0 wherever it is drawn; layer
    # 1 alone goes through x = 36..44, where layer 0 has its gap.
    assert (indices[40, :96] == 2).all()
    only_layer_0 = rasterize(x, flat[:1], flat[:1], np.array([1]), 100, 80)
    assert (only_layer_0[40, 36:45] == 0).all()
    assert (only_layer_0[40, :36] == 1).all() and (only_layer_0[40, 45:96] == 1).all()
    # A steep segment covers every row between its ends, in the columns it crosses.
    steep = np.array([[10.0, 70.0]], dtype=np.float32)
    column = rasterize(np.array([20.0, 22.0]), steep, steep, np.array([1]), 40, 80)
    assert set(np.flatnonzero(column.any(axis=1))) == set(range(10, 71))


def test_each_pixel_shows_the_largest_colour_of_the_runs_over_it() -> None:
    # The image is made from blocks of powers of two; written one pixel at a time, every
    # run gives the same image: runs of every length, many overlapping, some clipped.
    rng = np.random.default_rng(7)
    width, height, layers, count = 60, 90, 40, 45
    x = np.sort(rng.uniform(-3, width + 3, count))
    low = rng.uniform(-20, height + 20, (layers, count)).astype(np.float32)
    high = (low - rng.exponential(12, (layers, count))).astype(np.float32)
    low[3, 5:9] = np.nan
    colors = rng.integers(1, 9, layers).astype(np.uint16)
    expected = np.zeros((height, width), dtype=np.uint16)
    runs = line_runs(x, low, high, width, height)
    assert ((runs[2] - runs[1] + 1) > 64).sum() > 10  # runs longer than two top blocks too
    for column, first, last, layer in zip(*runs, strict=True):
        pixels = expected[first : last + 1, column]
        np.maximum(pixels, colors[layer], out=pixels)
    assert expected.any() and (expected == 0).any()
    assert np.array_equal(rasterize(x, low, high, colors, width, height), expected)


def _history(layers: int, steps: int):
    from gradscope.core.history import RunHistory
    from gradscope.core.watch import StepStats, classify

    names = [f"layer{i}" for i in range(layers)]
    history = RunHistory(capacity=steps)
    rng = np.random.default_rng(0)
    base = 10.0 ** rng.uniform(-3, -1, layers)
    zeros = np.zeros(layers, dtype=np.int64)
    for step in range(steps):
        norms = base * np.exp(rng.normal(0, 0.2, layers))
        if step == 4321:
            norms[17] = 1e4  # one layer's spike at one step
        if step == 2000:
            norms[23] = np.nan
        stats = StepStats(
            step=step,
            loss=1.0,
            total_grad_norm=1.0,
            grad_norm=norms,
            max_abs=norms,
            weight_norm=np.ones(layers),
            nan_count=zeros,
            inf_count=zeros,
            status=classify(norms, zeros, 1e6, 1e-9),
            param_grad_norm=norms,
        )
        history.append(step, 1.0, stats, names, ["Linear"] * layers, [4] * layers)
    return names, history


@pytest.fixture
def plot_of_many_layers(qtbot):
    from gradscope.gui.plots import GradientNormPlot, PlotView, layer_color
    from gradscope.gui.plots.gradient_norm_plot import GROUPED_ABOVE

    names, history = _history(GROUPED_ABOVE + 10, 6000)
    plot = GradientNormPlot()
    qtbot.addWidget(plot)
    plot.resize(700, 450)
    plot.show()
    colors = {name: layer_color(i) for i, name in enumerate(names)}
    plot.refresh(PlotView(history=history, order=names, visible=set(names), colors=colors))
    assert plot.grouped
    return plot, colors


def _pixel(plot, x: float, y: float) -> tuple[int, int]:
    point = plot.widget.mapFromScene(plot.item.vb.mapViewToScene(pg.Point(x, y)))
    return point.x(), point.y()


def _colors_near(image: QImage, x: int, y: int, reach: int) -> set[int]:
    return {
        image.pixelColor(x + dx, y + dy).rgb()
        for dx in range(-reach, reach + 1)
        for dy in range(-reach, reach + 1)
    }


def test_a_spike_of_one_layer_at_one_step_shows_in_its_column_at_every_zoom(
    plot_of_many_layers,
) -> None:
    plot, colors = plot_of_many_layers
    spike = colors["layer17"].rgb()
    width = plot.item.vb.width()
    for low, high in ((0, 6000), (3000, 5000), (4200, 4400), (4310, 4330)):
        plot.item.setXRange(low, high, padding=0)
        image = plot.widget.grab().toImage()
        steps_per_pixel = (high - low) / width
        assert plot.group_lines._x.size <= width + 2  # at most a block per pixel column
        x, y = _pixel(plot, 4321, 4.0)
        assert spike in _colors_near(image, x, y, reach=1), (low, high, steps_per_pixel)
        # Only there: 10 pixels left or right, nothing reaches that high.
        for side in (-10, 10):
            assert spike not in _colors_near(image, x + side, y, reach=1), (low, high, side)


def test_a_nan_marker_stays_on_top_of_the_lines_after_a_zoom(plot_of_many_layers) -> None:
    from gradscope.gui.status_style import NONFINITE_MARKER_COLOR

    plot, _colors = plot_of_many_layers
    marker = QColor(NONFINITE_MARKER_COLOR).rgb()
    for low, high in ((0, 6000), (1900, 2100), (1995, 2005)):
        plot.item.setXRange(low, high, padding=0)
        image = plot.widget.grab().toImage()
        (_, _), (_, top) = plot.item.vb.viewRange()
        _, pixel_height = plot.item.vb.viewPixelSize()
        x, y = _pixel(plot, 2000, top - 8 * pixel_height)
        assert marker in _colors_near(image, x, y, reach=2), (low, high)


def test_a_repaint_with_nothing_changed_draws_the_kept_image(plot_of_many_layers) -> None:
    plot, _colors = plot_of_many_layers
    lines = plot.group_lines
    plot.item.setXRange(1000, 3000, padding=0)
    first = plot.widget.grab().toImage()
    made = lines.rasterized
    again = plot.widget.grab().toImage()
    assert lines.rasterized == made and again == first
    plot.item.setXRange(1100, 3100, padding=0)  # a pan
    plot.widget.grab()
    assert lines.rasterized == made + 1
    plot.resize(800, 450)
    plot.widget.grab()
    assert lines.rasterized == made + 2


def test_a_high_density_screen_gets_an_image_of_its_own_pixels(plot_of_many_layers) -> None:
    from PySide6.QtGui import QPixmap
    from PySide6.QtWidgets import QWidget

    plot, colors = plot_of_many_layers
    plot.item.setXRange(3000, 5000, padding=0)
    plot.widget.grab()
    size = plot.widget.size()
    pixmap = QPixmap(size.width() * 2, size.height() * 2)
    pixmap.setDevicePixelRatio(2.0)
    pixmap.fill(QColor("white"))
    QWidget.render(plot.widget, pixmap)  # the widget (pyqtgraph's render is the scene's)
    assert plot.group_lines._image.devicePixelRatio() == 2.0
    image = pixmap.toImage()
    x, y = _pixel(plot, 4321, 4.0)
    assert colors["layer17"].rgb() in _colors_near(image, 2 * x, 2 * y, reach=2)
