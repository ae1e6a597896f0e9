"""Plot helpers that must never hide a non-finite value."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from gradscope.core.history import MISSING
from gradscope.gui.plots import log10_display, reduce_steps


def test_log10_display_leaves_nonpositive_and_nonfinite_to_the_markers() -> None:
    values = np.array([100.0, 0.0, np.nan, np.inf, MISSING, 1e-3])
    shown = log10_display(values)
    assert shown[0] == 2 and shown[5] == -3
    assert np.isnan(shown[1:5]).all()


def test_reduce_steps_keeps_every_nonfinite_step() -> None:
    matrix = np.ones((10_001, 3), dtype=np.float32)
    matrix[4567, 0] = np.nan
    matrix[9999, 1] = np.inf
    matrix[:, 2] = MISSING
    matrix[10_000, 2] = 5.0
    reduced, per_row = reduce_steps(matrix, limit=2000)
    assert len(reduced) <= 2000 and per_row == 6
    assert np.isnan(reduced[4567 // per_row, 0])
    assert np.isinf(reduced[9999 // per_row, 1])
    assert reduced[-1, 2] == 5.0 and reduced[0, 2] == MISSING
    assert np.isnan(reduced[:, 0]).sum() == 1


def test_reduce_steps_is_a_no_op_for_short_runs() -> None:
    matrix = np.arange(12, dtype=np.float32).reshape(4, 3)
    reduced, per_row = reduce_steps(matrix)
    assert per_row == 1 and reduced is matrix


# -- incremental drawing of long histories (issue 6) -------------------------------------
def _history(layers: int, steps: int, seed: int = 0):
    from gradscope.core.history import RunHistory
    from gradscope.core.watch import StepStats, classify

    names = [f"layer{i}" for i in range(layers)]
    history = RunHistory(capacity=8)
    rng = np.random.default_rng(seed)
    base = 10.0 ** rng.uniform(-6, 3, layers)
    zeros = np.zeros(layers, dtype=np.int64)

    def append(count: int) -> None:
        for _ in range(count):
            step = history.count
            norms = base * np.exp(rng.normal(0, 0.3, layers))
            if step % 17 == 5:
                norms[step % layers] = np.nan
            if step % 23 == 7:
                norms[(step + 3) % layers] = 0.0
            stats = StepStats(
                step=step,
                loss=1.0,
                total_grad_norm=float(np.nansum(norms)),
                grad_norm=norms,
                max_abs=norms,
                weight_norm=np.ones(layers),
                nan_count=zeros,
                inf_count=zeros,
                status=classify(norms, zeros, 1000.0, 1e-7),
                param_grad_norm=norms,
            )
            history.append(step, 1.0, stats, names, ["Linear"] * layers, [4] * layers)

    append(steps)
    return names, history, append


def _view(names, history, visible=None, selected=None):
    from gradscope.gui.plots import PlotView, layer_color

    return PlotView(
        history=history,
        order=list(names),
        visible=set(names if visible is None else visible),
        selected_layer=selected,
        colors={name: layer_color(i) for i, name in enumerate(names)},
    )


def _shown_plot(qtbot, plot_class):
    plot = plot_class()
    qtbot.addWidget(plot)
    plot.resize(600, 400)
    plot.show()
    return plot


def test_log_cache_grows_with_new_steps_and_starts_over_after_a_rewind() -> None:
    from gradscope.gui.plots.log_norm_cache import LogNormCache

    _names, history, append = _history(5, 40)
    cache = LogNormCache()
    assert cache.update(history)
    append(25)
    assert cache.update(history) and not cache.update(history)
    full = log10_display(history.matrix("grad_norm")).T.astype(np.float32)
    assert np.array_equal(cache.values[:5, : cache.rows], full, equal_nan=True)
    assert len(cache.edge_rows) == int(
        (~np.isfinite(full) | (history.matrix("grad_norm").T == 0)).sum()
    )
    resets = cache.resets
    history.rewind_to(30)
    append(40)  # a new branch, as long as before: the old rows must not be kept
    cache.update(history)
    assert cache.resets > resets
    full = log10_display(history.matrix("grad_norm")).T.astype(np.float32)
    assert np.array_equal(cache.values[:5, : cache.rows], full, equal_nan=True)


def test_peak_levels_made_from_finer_levels_equal_peaks_of_the_steps() -> None:
    from gradscope.gui.plots.log_norm_cache import LogNormCache
    from gradscope.gui.plots.peak_cache import PeakLevels

    _names, history, append = _history(6, 300)
    cache = LogNormCache()
    cache.update(history)
    levels = PeakLevels()
    assert levels.block_size(0.3) == 1 and levels.block_size(5) == 8
    levels.level(cache, 2)  # a zoom in first; the coarser levels then come from it
    append(133)  # steps arrive; every level follows
    cache.update(history)
    for per_block in (4, 8, 16, 2):
        level = levels.level(cache, per_block)
        complete = cache.rows // per_block
        assert level.blocks == complete
        blocks = cache.values[:6, : complete * per_block].reshape(6, complete, per_block)
        for name, expected in (("low", blocks.min(axis=2)), ("high", blocks.max(axis=2))):
            got = getattr(level, name)[:6, :complete]
            # NaN wins a block (a gap never closes), whichever way the level was made.
            assert np.array_equal(got, expected, equal_nan=True), (per_block, name)
    assert np.isnan(levels.levels[16].low[:6, : cache.rows // 16]).any()


def test_many_layers_are_drawn_together_with_gaps_and_markers(qtbot) -> None:
    from gradscope.gui.plots import GradientNormPlot
    from gradscope.gui.plots.gradient_norm_plot import GROUPED_ABOVE

    names, history, append = _history(GROUPED_ABOVE + 20, 300)
    plot = _shown_plot(qtbot, GradientNormPlot)
    plot.item.setXRange(0, 299, padding=0)
    plot.refresh(_view(names, history, selected="layer3"))
    assert plot.grouped and plot.group_lines.isVisible()
    # Only the selected layer has a curve of its own, drawn wider.
    assert [name for name, curve in plot.curves.items() if curve.isVisible()] == ["layer3"]
    assert plot.curves["layer3"].opts["pen"].widthF() > 1
    # Every value of every ticked layer is drawn (here 300 steps: no downsampling), NaN
    # where the line breaks; each layer in its own colour.
    lines = plot.group_lines
    logged = log10_display(history.matrix("grad_norm")).T.astype(np.float32)
    assert np.array_equal(lines._x, history.steps.astype(np.float64))
    assert np.array_equal(lines._low, logged, equal_nan=True)
    assert np.array_equal(lines._high, logged, equal_nan=True)
    palette = lines._palette[lines._color_index]
    assert len(set(palette.tolist())) == len(
        {_view(names, history).colors[n].rgba() for n in names}
    )
    matrix = history.matrix("grad_norm")
    assert len(plot.markers.points()) == int((~np.isfinite(matrix) | (matrix == 0)).sum())
    # New steps reach the lines; a long history is peak-downsampled to the view's width.
    append(3000)
    plot.item.setXRange(0, history.count, padding=0)
    plot.refresh(_view(names, history))
    assert 0 < len(lines._x) <= plot.item.vb.width() + 1
    assert lines._low.shape == (len(names), len(lines._x))
    # Hovering finds a layer's point from the lines drawn together.
    plot.item.setXRange(100, 140, padding=0)
    plot.widget.grab()  # settles the ranges
    row = 120
    value = float(history.matrix("grad_norm")[row, 4])
    scene_pos = plot.item.vb.mapViewToScene(pg.Point(row, np.log10(value)))
    found = plot.nearest(scene_pos)
    assert found is not None and found[1] == row


def test_heatmap_drawn_step_by_step_equals_drawn_at_once(qtbot) -> None:
    from gradscope.gui.plots import HEATMAP_MAX_COLUMNS, HeatmapPlot

    names, history, append = _history(6, HEATMAP_MAX_COLUMNS - 50)
    growing = HeatmapPlot()
    qtbot.addWidget(growing)
    growing.refresh(_view(names, history))
    for _ in range(4):  # crosses the limit: blocks of two steps from then on
        append(37)
        growing.refresh(_view(names, history))
    fresh = HeatmapPlot()
    qtbot.addWidget(fresh)
    fresh.refresh(_view(names, history))
    assert growing.steps_per_column == fresh.steps_per_column == 2
    assert np.array_equal(growing.rgba, fresh.rgba)
    assert growing.levels == fresh.levels
    nonfinite = (growing.rgba[..., 0] == 214) & (growing.rgba[..., 1] == 39)
    assert nonfinite.sum() >= 1


def test_nice_rounding_of_the_step_axis_while_running() -> None:
    from gradscope.gui.plots.plot_panel import round_up_to_nice

    assert [round_up_to_nice(v) for v in (0.3, 1, 1.5, 3, 7, 12, 4500)] == [
        1,
        1,
        2,
        5,
        10,
        20,
        5000,
    ]


def test_many_layers_with_few_steps_show_dots(qtbot) -> None:
    from gradscope.gui.plots import GradientNormPlot
    from gradscope.gui.plots.gradient_norm_plot import GROUPED_ABOVE

    names, history, _append = _history(GROUPED_ABOVE + 5, 1)
    plot = _shown_plot(qtbot, GradientNormPlot)
    plot.item.setXRange(-1, 1, padding=0)
    plot.refresh(_view(names, history))
    assert plot.grouped and plot.group_dots.isVisible()
    assert len(plot.group_dots.points()) == len(names)  # one step: no line, a dot each


def test_markers_of_many_layers_at_one_step_collapse_to_one_per_kind(qtbot) -> None:
    from gradscope.core.history import RunHistory
    from gradscope.core.watch import StepStats, classify
    from gradscope.gui.plots import GradientNormPlot

    layers, steps = 60, 30
    names = [f"layer{i}" for i in range(layers)]
    history = RunHistory()
    zeros = np.zeros(layers, dtype=np.int64)
    for step in range(steps):
        norms = np.zeros(layers)  # every layer's gradient is exactly zero...
        if step == 10:
            norms[:5] = np.nan  # ...and five layers go NaN at step 10
        stats = StepStats(
            step=step,
            loss=1.0,
            total_grad_norm=0.0,
            grad_norm=norms,
            max_abs=norms,
            weight_norm=np.ones(layers),
            nan_count=zeros,
            inf_count=zeros,
            status=classify(norms, zeros, 1000.0, 1e-7),
            param_grad_norm=norms,
        )
        history.append(step, 1.0, stats, names, ["Linear"] * layers, [4] * layers)
    plot = GradientNormPlot()
    qtbot.addWidget(plot)
    plot.refresh(_view(names, history))
    spots = plot.markers.points()
    # one zero marker per step, plus one NaN marker at step 10 (not 60 x 30 + 5)
    assert len(spots) == steps + 1
    assert sum(1 for spot in spots if np.isnan(spot.data()[2])) == 1


def test_heatmap_names_its_layers_and_gives_zero_its_own_colour(qtbot) -> None:
    from gradscope.gui.plots import ZERO_RGBA, HeatmapPlot
    from gradscope.gui.plots.heatmap_colors import VIRIDIS_LUT

    names, history, _ = _history(layers=5, steps=30)
    heatmap = HeatmapPlot()
    qtbot.addWidget(heatmap)
    heatmap.resize(600, 400)
    heatmap.show()
    heatmap.refresh(_view(names, history))
    axis = heatmap.item.getAxis("left")
    values = [v for _, ticks in axis.tickValues(-0.5, 4.5, 300) for v in ticks]
    assert axis.tickStrings(values, 1, 1) == names
    # Step 7 has an exact zero gradient in layer (7 + 3) % 5 = 0: not the lowest colour of
    # the scale (a small value), but a colour of its own.
    zero = heatmap.rgba[7, 0]
    assert history.matrix("grad_norm")[7, 0] == 0
    assert tuple(zero) == ZERO_RGBA
    assert not any(tuple(zero) == tuple(row) for row in VIRIDIS_LUT)


def test_the_legend_stays_off_the_curves_and_with_many_layers(qtbot) -> None:
    from gradscope.gui.plots import GradientNormPlot

    names, history, _ = _history(layers=20, steps=30)
    plot = GradientNormPlot()
    qtbot.addWidget(plot)
    plot.resize(700, 450)
    plot.show()
    plot.refresh(_view(names, history, visible=names[:5]))
    qtbot.wait(20)
    labels = [label.text for _, label in plot.legend.items]
    assert labels[:5] == names[:5]
    assert not plot.legend.sceneBoundingRect().intersects(plot.item.vb.sceneBoundingRect())
    # Twenty layers: eight entries at most, the selected one first, and how many more.
    plot.show_selection("layer17", None)
    plot.refresh(_view(names, history, selected="layer17"))
    labels = [label.text for _, label in plot.legend.items]
    assert plot.legend.isVisible()
    assert labels[0] == "layer17" and labels[7] == "+13 more ▸"


def test_grouped_lines_auto_range_and_keep_every_extreme_value(qtbot) -> None:
    # The layers drawn together (issue 17, zoom) give their own data bounds: the y
    # auto-range still reaches an extreme finite value and the smallest one in view, the
    # image shows them, and the NaN keeps its marker.
    from gradscope.core.history import RunHistory
    from gradscope.core.watch import StepStats, classify
    from gradscope.gui.plots import GradientNormPlot
    from gradscope.gui.plots.gradient_norm_plot import GROUPED_ABOVE

    layers, steps = GROUPED_ABOVE + 10, 2000
    names = [f"layer{i}" for i in range(layers)]
    history = RunHistory(capacity=8)
    rng = np.random.default_rng(3)
    zeros = np.zeros(layers, dtype=np.int64)
    for step in range(steps):
        norms = 10.0 ** rng.uniform(-3, 3, layers)
        if step == 1500:
            norms[5], norms[6], norms[7] = 1e30, 1e-12, np.nan
        stats = StepStats(
            step=step,
            loss=1.0,
            total_grad_norm=1.0,
            grad_norm=norms,
            max_abs=norms,
            weight_norm=np.ones(layers),
            nan_count=zeros,
            inf_count=zeros,
            status=classify(norms, zeros, 1e40, 1e-20),
            param_grad_norm=norms,
        )
        history.append(step, 1.0, stats, names, ["Linear"] * layers, [4] * layers)
    plot = _shown_plot(qtbot, GradientNormPlot)
    plot.refresh(_view(names, history))
    lines = plot.group_lines
    for low, high in ((0, steps), (1400, 1600), (1490, 1510)):
        plot.item.setXRange(low, high, padding=0)
        image = plot.widget.grab().toImage()  # settles the auto-range
        (_, _), (bottom, top) = plot.item.vb.viewRange()
        assert top >= 30 and bottom <= -12, (low, high, bottom, top)
        assert any(abs(spot.pos().x() - 1500) < 0.5 for spot in plot.markers.points())
        finite = np.isfinite(lines._low)
        assert lines.dataBounds(1) == (
            float(lines._low[finite].min()),
            float(lines._high[finite].max()),
        )
        assert lines.dataBounds(1)[1] == 30 and lines.dataBounds(1)[0] == -12
        # The spike to 1e30 and the dip to 1e-12 are drawn, in their layers' colours.
        for layer, value in ((5, 30.0), (6, -12.0)):
            color = _view(names, history).colors[names[layer]]
            x, y = _widget_pixel(plot, 1500, value)
            assert _has_color_near(image, x, y, color), (low, high, layer)


def _widget_pixel(plot, x: float, y: float) -> tuple[int, int]:
    scene = plot.item.vb.mapViewToScene(pg.Point(x, y))
    point = plot.widget.mapFromScene(scene)
    return point.x(), point.y()


def _has_color_near(image, x: int, y: int, color, reach: int = 2) -> bool:
    for dx in range(-reach, reach + 1):
        for dy in range(-reach, reach + 1):
            if image.pixelColor(x + dx, y + dy).rgb() == color.rgb():
                return True
    return False


def test_flow_bars_name_nan_in_the_apps_sans_font_and_thresholds_only_under_the_axis(qtbot):
    # Issue 27: the "NaN" on a bar was drawn in a serif (a QFont with an empty family), and
    # the "vanish" name sat in a box on its line, over the bars.
    import pyqtgraph as pg
    from PySide6.QtGui import QFontInfo
    from PySide6.QtWidgets import QApplication

    from gradscope.gui.plots import GradientFlowPlot

    names, history, _ = _history(6, 6)  # step 5 has a NaN in layer5
    plot = _shown_plot(qtbot, GradientFlowPlot)
    plot.refresh(_view(names, history, selected=None))
    texts = [i for i in plot.item.items if isinstance(i, pg.TextItem)]
    nan_labels = [t for t in texts if t.textItem.toPlainText() in ("NaN", "Inf")]
    assert len(nan_labels) == 1
    family = QFontInfo(nan_labels[0].textItem.font()).family()
    assert family == QFontInfo(QApplication.font()).family()
    assert "serif" not in family.lower() or "sans" in family.lower()
    assert not any("vanish" in t.textItem.toPlainText() for t in texts)
    for line in (plot.vanish_line, plot.explode_line):
        assert getattr(line, "label", None) is None
    assert "vanish" in plot.item.getAxis("bottom").labelText


def test_the_flow_charts_threshold_names_stay_clear_of_its_statistic_box(qtbot):
    # Seen at 1280x800 on the X display: the chart is about 285 px wide, and its centred
    # axis label ("‖grad‖ ┊ vanish ┊ explode") ran under the statistic box in the corner.
    from PySide6.QtCore import QRect

    from gradscope.gui.plots import GradientFlowPlot

    names, history, _ = _history(6, 6)
    plot = _shown_plot(qtbot, GradientFlowPlot)
    plot.resize(285, 300)
    plot.refresh(_view(names, history, selected=None))
    qtbot.wait(50)
    label = plot.item.getAxis("bottom").label
    scene_rect = label.mapRectToScene(label.boundingRect())
    view_rect = plot.widget.mapFromScene(scene_rect).boundingRect()
    box = plot.statistic_selector.geometry()
    assert view_rect.width() > 100  # the whole label is there
    assert not QRect(view_rect).intersects(box), (view_rect, box)
