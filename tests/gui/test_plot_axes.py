"""The plots' grid: the same look as pyqtgraph's translucent grid, drawn opaque (Qt draws
translucent aliased lines ~25x slower) and behind the data (so it never hides a curve)."""

from __future__ import annotations

import itertools

import numpy as np
from PySide6.QtGui import QColor, QImage, QPainter

from gradscope.gui.plot_axes import GridAxis, opaque_over


def test_opaque_over_is_alpha_blending() -> None:
    grid = QColor(51, 51, 51, 38)
    white = QColor(255, 255, 255)
    shown = opaque_over(grid, white)
    assert shown.alpha() == 255
    assert shown.red() == shown.green() == shown.blue() == round(51 * 38 / 255 + 255 * 217 / 255)
    assert opaque_over(QColor(10, 20, 30), white).getRgb() == (10, 20, 30, 255)


def _alphas(axis: GridAxis, width: int, height: int) -> np.ndarray:
    image = QImage(width, height, QImage.Format.Format_ARGB32)
    image.fill(0)
    painter = QPainter(image)
    axis.picture = None
    axis.paint(painter, None, None)
    painter.end()
    pixels = np.frombuffer(image.constBits(), dtype=np.uint8).reshape(height, width, 4)
    return pixels[:, :, 3].copy()  # ARGB32 little-endian: B, G, R, A


def test_every_plot_axis_draws_its_grid_opaque_and_behind_the_data(qtbot) -> None:
    from gradscope.gui.plots import PlotPanel

    panel = PlotPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 600)
    panel.show()
    plot = panel.gradient_norm.item
    plot.setYRange(-9, 4, padding=0)  # 13 decades: many faded minor grid lines
    plot.setXRange(0, 1000, padding=0)
    panel.grab()
    for each in (panel.gradient_norm, panel.loss, panel.heatmap, panel.flow):
        for name in ("left", "bottom"):
            axis = each.item.getAxis(name)
            assert isinstance(axis, GridAxis)
            assert axis.zValue() < each.item.vb.zValue()  # under the curves
    left = plot.getAxis("left")
    rect = left.boundingRect()
    alphas = _alphas(left, int(rect.width()) + 1, int(rect.height()) + 1)
    # Right of the tick labels the axis draws only grid lines: every pixel is either
    # untouched or fully opaque (pyqtgraph's own grid leaves partial alphas there).
    grid_area = alphas[:, int(left.width()) + 2:]
    assert (grid_area == 255).sum() > 1000
    assert set(np.unique(grid_area)) <= {0, 255}


def test_the_grid_blends_with_its_own_view_background(qtbot) -> None:
    import pyqtgraph as pg

    from gradscope.gui.plot_axes import GridAxis

    for background, expect_opaque in (("k", True), (None, False)):
        axis = GridAxis("left")
        widget = pg.PlotWidget(axisItems={"left": axis}, background=background)
        qtbot.addWidget(widget)
        widget.resize(400, 300)
        widget.getPlotItem().showGrid(y=True, alpha=0.15)
        widget.getPlotItem().setYRange(0, 10)
        widget.show()
        widget.grab()
        image = QImage(1, 1, QImage.Format.Format_ARGB32)
        painter = QPainter(image)
        pens = [pen for pen, _, _ in axis.generateDrawSpecs(painter)[1]]
        painter.end()
        grid = [axis._opaque(pen, axis.background()) if axis.background() else pen
                for pen in pens]
        if expect_opaque:
            assert axis.background().getRgb() == (0, 0, 0, 255)
            # Grey at 15% over black stays dark, never the near-white it is over white.
            assert all(pen.color().alpha() == 255 and pen.color().red() < 128 for pen in grid)
        else:
            assert axis.background() is None
            assert any(pen.color().alpha() < 255 for pen in grid)


def test_long_layer_names_keep_their_block_index() -> None:
    from gradscope.gui.plot_axes import elide

    assert elide("features.denseblock4.denselayer16.conv2") == "fea.den4.den16.conv2"
    short = elide("encoder.layers.encoder_layer_11.self_attention.out_proj")
    assert len(short) <= 26 and "11" in short and short.endswith("out_proj")
    assert elide("layer1.0.conv1") == "layer1.0.conv1" and elide("") == "(model)"
    # Siblings stay apart.
    assert elide("features.denseblock3.denselayer16.conv2") != elide(
        "features.denseblock4.denselayer16.conv2")


def test_every_axis_writes_numbers_the_same_way(qtbot) -> None:
    from gradscope.gui.plot_axes import GridAxis

    linear = GridAxis("left")
    assert linear.tickStrings([5e10, 1e11, 1.5e11], 1, 5e10) == ["5·10¹⁰", "10¹¹", "1.5·10¹¹"]
    assert linear.tickStrings([0.1, 0.2, 0.30000000000000004], 1, 0.1) == ["0.1", "0.2", "0.3"]
    log = GridAxis("left")
    log.setLogMode(False, True)
    log.setRange(-3, 0)  # three decades: minor ticks unlabelled
    assert log.tickStrings([-2, -2 + 0.30103, -1], 1, 1) == ["0.01", None, "0.1"]
    assert log.tickStrings([11, 11.477], 1, 1)[0] == "10¹¹"
    log.setRange(-1.1, -0.9)  # within a decade: every tick has a label
    assert log.tickStrings([-1, -1 + 0.04139], 1, 0.1) == ["0.1", "0.11"]


def test_batched_tick_drawing_gives_pyqtgraphs_pixels(qtbot) -> None:
    # GridAxis draws each tick level with one drawLines call (issue 17, zoom): the image
    # must be pyqtgraph's own drawing of the same ticks with the opaque pens, pixel for pixel.
    import pyqtgraph as pg

    axis = GridAxis("left")
    widget = pg.PlotWidget(axisItems={"left": axis})
    qtbot.addWidget(widget)
    widget.resize(500, 400)
    axis.setLogMode(True)
    widget.getPlotItem().showGrid(x=True, y=True, alpha=0.15)
    widget.getPlotItem().setYRange(-9, 4, padding=0)
    widget.show()
    widget.grab()
    rect = axis.boundingRect()
    width, height = int(rect.width()) + 1, int(rect.height()) + 1
    images = []
    for draw in ("batched", "pyqtgraph"):
        image = QImage(width, height, QImage.Format.Format_ARGB32)
        image.fill(0)
        painter = QPainter(image)
        axis_spec, ticks, texts = axis.generateDrawSpecs(painter)
        assert len(ticks) > 100
        if draw == "batched":
            axis.drawPicture(painter, axis_spec, ticks, texts)
        else:
            background = axis.background()
            ticks = [(axis._opaque(pen, background), a, b) for pen, a, b in ticks]
            pg.AxisItem.drawPicture(axis, painter, axis_spec, ticks, texts)
        painter.end()
        images.append(np.frombuffer(image.constBits(), dtype=np.uint8).copy())
    assert (images[0] != 0).sum() > 1000
    assert np.array_equal(images[0], images[1])


def _specs(axis, generate):
    from PySide6.QtGui import QPainter, QPicture

    picture = QPicture()
    painter = QPainter(picture)
    if axis.style["tickFont"]:
        painter.setFont(axis.style["tickFont"])
    try:
        axis_spec, ticks, texts = generate(axis, painter)
    finally:
        painter.end()

    def point(p):
        return (round(p.x(), 9), round(p.y(), 9))

    def pen(p):
        return (p.color().rgba(), p.widthF())

    return (
        (pen(axis_spec[0]), point(axis_spec[1]), point(axis_spec[2])),
        [(pen(p), point(a), point(b)) for p, a, b in ticks],
        [((r.x(), r.y(), r.width(), r.height()), int(flags), text) for r, flags, text in texts],
    )


def test_the_axes_own_draw_specs_equal_pyqtgraphs(qtbot) -> None:
    # GridAxis makes its ticks and labels itself (issue 17, zoom: pyqtgraph's made two
    # Python Point objects per tick and measured every label at every zoom): the same
    # lines, pens and labels as pyqtgraph's, on log and linear axes, zoomed in and out.
    import pyqtgraph as pg

    from gradscope.gui.plot_axes import GridAxis, LayerAxis

    left, bottom = GridAxis("left"), GridAxis("bottom")
    widget = pg.PlotWidget(axisItems={"left": left, "bottom": bottom})
    qtbot.addWidget(widget)
    widget.getPlotItem().showGrid(x=True, y=True, alpha=0.15)
    widget.resize(600, 400)
    widget.show()
    layers = LayerAxis("left")
    layers.names = [f"block{i}.conv" for i in range(300)]
    heat = pg.PlotWidget(axisItems={"left": layers})
    qtbot.addWidget(heat)
    heat.resize(500, 350)
    heat.show()
    item = widget.getPlotItem()
    compared = 0
    for log in (True, False):
        left.setLogMode(log)
        for (x0, x1), (y0, y1) in (((0, 20000), (-9, 4)), ((9000, 11000), (-3.2, -0.4)),
                                   ((9990, 10012), (-1.05, -0.95)), ((-0.5, 9.5), (0, 1e6))):
            item.setXRange(x0, x1, padding=0.02)
            item.setYRange(y0, y1, padding=0.02)
            widget.grab()
            for axis in (left, bottom):
                ours = _specs(axis, GridAxis.generateDrawSpecs)
                theirs = _specs(axis, pg.AxisItem.generateDrawSpecs)
                assert ours == theirs, (log, x0, x1, y0, y1, axis.orientation)
                assert ours[1] and ours[2]
                compared += 1
    for low, high in ((-0.5, 299.5), (40.5, 60.5)):
        heat.getPlotItem().setYRange(low, high, padding=0)
        heat.grab()
        assert _specs(layers, GridAxis.generateDrawSpecs) == \
            _specs(layers, pg.AxisItem.generateDrawSpecs)
        compared += 1
    assert compared == 18


def test_zoomed_in_step_ticks_have_labels_that_tell_them_apart() -> None:
    # Zoomed in on step 10,000 the step axis read "10⁴ 10⁴ 10⁴ 1.01·10⁴ 1.01·10⁴" (three
    # significant digits above 10⁴); ticks now get the digits their spacing needs.
    from gradscope.gui.plot_axes import GridAxis

    steps = GridAxis("bottom")
    for values, spacing in (([9990, 9995, 10000, 10005, 10010, 10015], 5),
                            ([123450, 123452, 123454], 2), ([1000.2, 1000.4, 1000.6], 0.2)):
        labels = steps.tickStrings(values, 1, spacing)
        assert len(set(labels)) == len(labels), labels
    assert steps.tickStrings([10000, 10005], 1, 5) == ["10⁴", "1.0005·10⁴"]
    assert steps.tickStrings([0, 10000, 20000], 1, 10000) == ["0", "10⁴", "2·10⁴"]


def _drawn_labels(qtbot, low: float, high: float, height: int) -> list[tuple[str, float, float]]:
    """The labels a log value axis of a ``height`` px plot draws over log10 ``low..high``:
    (text, top, bottom), top to bottom."""
    import pyqtgraph as pg

    from gradscope.gui.plot_axes import GridAxis

    axis = GridAxis("left")
    widget = pg.PlotWidget(axisItems={"left": axis, "bottom": GridAxis("bottom")})
    qtbot.addWidget(widget)
    widget.resize(400, height)
    axis.setLogMode(True)
    axis.setWidth(64)  # the gradient-norm plot's (LEFT_AXIS_WIDTH)
    widget.getPlotItem().setYRange(low, high, padding=0)
    widget.show()
    widget.grab()
    image = QImage(100, 1000, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    _, _, texts = axis.generateDrawSpecs(painter)
    painter.end()
    return sorted(((text, r.top(), r.bottom()) for r, _, text in texts), key=lambda t: t[1])


# Ranges seen at 1280x800 (the gradient-norm plot is about 270 px tall there).
_LOG_RANGES = [
    (-0.6, 0.65),  # norms from 0.25 to 4.5: only "1" was labelled
    (-3, 1),  # "1", "0.1", "0.01" were each drawn twice, on top of each other
    (-3.02, 1.0),
    (-1.1, -0.1),  # inside a decade: 0.09 and 0.08 overlapped
    (-12, 2),  # ticks every 5 decades: the top two decades had no label
    (-20, 0),
    (-35, 5),
    (8, 14),
    (-9, -8.2),
    (-0.28, -0.24),  # zoomed in: no power of ten, no 2 or 5 in view
]


def test_log_axis_labels_never_overlap_and_are_never_alone(qtbot) -> None:
    for low, high in _LOG_RANGES:
        for height in (200, 300):
            labels = _drawn_labels(qtbot, low, high, height)
            texts = [text for text, _, _ in labels]
            assert len(texts) >= 2, (low, high, height, texts)
            assert len(set(texts)) == len(texts), (low, high, height, texts)
            for (a, _, bottom), (b, top, _) in itertools.pairwise(labels):
                assert bottom <= top, (low, high, height, a, b)


def test_the_top_decade_in_view_is_labelled(qtbot) -> None:
    labels = [text for text, _, _ in _drawn_labels(qtbot, -12, 2, 250)]
    assert labels[0] == "100"
    labels = [text for text, _, _ in _drawn_labels(qtbot, -35, 5, 300)]
    assert labels[0] == "10⁵"
