"""The plots as a dashboard (issue 27): a statistic selector per plot, several recordings
compared on the same axes, zooming the step axis with y fitted to what is in view, and a
name on each bar of the gradient-flow chart. Real runs of a small MLP, recorded to
.gsrec files, feed the window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.core.history import MISSING
from gradscope.core.recording import RecordingReader

DETAIL_EVERY = 3


def record_run(path: Path, steps: int = 13, seed: int = 0, third_layer: bool = False) -> Path:
    """A real training run of a small MLP written to ``path`` (detail every 3rd step, with
    update ratios); ``third_layer`` adds a layer the other runs do not have."""
    torch.manual_seed(seed)
    modules = [nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)]
    if third_layer:
        modules += [nn.Linear(1, 1)]
    model = nn.Sequential(*modules)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * (seed + 1))
    with gradscope.watch(
        model, record=path, detail_every=DETAIL_EVERY, update_ratio=True, optimizer=optimizer
    ) as watch:
        for _ in range(steps):
            inputs = torch.randn(16, 4)
            loss = nn.functional.mse_loss(model(inputs), inputs.sum(1, keepdim=True))
            loss.backward()
            watch.collect(loss)
            optimizer.step()
            optimizer.zero_grad()
    return path


def _logged(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    out = np.full(values.shape, np.nan)
    good = np.isfinite(values) & (values > 0)
    out[good] = np.log10(values[good])
    return out


def _open(qtbot, window, path: Path) -> None:
    assert window.recordings.open_recording(path)
    window._refresh()


def test_each_plot_shows_the_statistic_its_selector_names(qtbot, window, tmp_path) -> None:
    path = record_run(tmp_path / "run.gsrec")
    _open(qtbot, window, path)
    history = window.history
    plots = window.plots
    layer = "2"
    column = history.column(layer)
    for statistic in ("max_abs", "weight_norm", "update_ratio", "grad_norm"):
        expected = history.matrix(statistic)[:, column]

        plots.gradient_norm.statistic_selector.choose(statistic)
        assert plots.gradient_norm.statistic == statistic
        steps, shown = plots.gradient_norm.curves[layer].getData()
        assert np.array_equal(steps, history.steps)
        assert np.allclose(shown, _logged(expected), equal_nan=True)
        if statistic != "grad_norm":
            # Detail-only: measured on every third step; nothing drawn in between (no
            # invented values), and each value a point (a symbol) of its own.
            measured = expected != MISSING
            assert measured.sum() == len(range(0, history.count, DETAIL_EVERY))
            assert np.isnan(shown[~measured]).all() and np.isfinite(shown[measured]).all()
            assert plots.gradient_norm.curves[layer].opts["symbol"] == "o"

        plots.heatmap.statistic_selector.choose(statistic)
        columns = [history.column(name) for name in plots.heatmap._order]
        assert np.array_equal(
            plots.heatmap._matrix, history.matrix(statistic)[:, columns], equal_nan=True
        )

        plots.flow.statistic_selector.choose(statistic)
        rows = np.flatnonzero((history.matrix(statistic) != MISSING).any(axis=1))
        last = int(rows[-1])
        order = plots.flow._order
        values = history.matrix(statistic)[last, [history.column(n) for n in order]]
        assert plots.flow.step == int(history.steps[last])
        assert np.allclose(plots.flow._values, values)
    # The statistics differ from each other: the selector is not showing one of them.
    assert not np.allclose(history.matrix("max_abs")[0], history.matrix("grad_norm")[0])


def _wheel(widget, notches: int) -> None:
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    viewport = widget.viewport()
    center = QPointF(viewport.width() / 2, viewport.height() / 2)
    event = QWheelEvent(
        center,
        QPointF(viewport.mapToGlobal(center.toPoint())),
        QPoint(0, 0),
        QPoint(0, 120 * notches),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(viewport, event)


def _visible_values(plot, x0: float, x1: float) -> np.ndarray:
    values = []
    for curve in plot.curves.values():
        if curve.isVisible():
            x, y = curve.getData()
            inside = (x >= x0) & (x <= x1) & np.isfinite(y)
            values += y[inside].tolist()
    return np.array(values)


def test_a_zoom_on_the_step_axis_keeps_the_data_in_view(qtbot, window, tmp_path) -> None:
    from PySide6.QtCore import QRectF

    _open(qtbot, window, record_run(tmp_path / "run.gsrec", steps=60))
    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)
    window._refresh()
    plot = window.plots.gradient_norm
    vb = plot.item.vb
    (x0, x1), _ = vb.viewRange()
    for zoom in ("wheel", "band"):
        if zoom == "wheel":
            _wheel(plot.widget, 6)
        else:  # the rectangle a left-drag ends with, over a sliver of the values
            (a, b), (low, high) = vb.viewRange()
            vb.showAxRect(QRectF(a + (b - a) * 0.2, low, (b - a) * 0.4, (high - low) * 0.01))
        vb.prepareForPaint()
        (z0, z1), (y0, y1) = vb.viewRange()
        assert z1 - z0 < (x1 - x0) * 0.9, zoom  # the steps zoomed in
        x0, x1 = z0, z1
        shown = _visible_values(plot, z0, z1)
        assert shown.size
        # Every value in the step range is in view, and the view is fitted to them (not
        # to the whole run, nor to a wheel's guess).
        assert y0 <= shown.min() and shown.max() <= y1, zoom
        assert (y1 - y0) <= (shown.max() - shown.min()) * 1.5 + 0.2, zoom
    # The loss plot shares the step range and fits its own values too.
    loss_vb = window.plots.loss.item.vb
    loss_vb.prepareForPaint()
    (l0, l1), (ly0, ly1) = loss_vb.viewRange()
    assert (l0, l1) == pytest.approx((x0, x1))
    x, y = window.plots.loss.curve.getData()
    inside = y[(x >= l0) & (x <= l1) & np.isfinite(y)]
    assert ly0 <= inside.min() and inside.max() <= ly1


def test_the_flow_chart_names_each_bar(qtbot, window, tmp_path) -> None:
    _open(qtbot, window, record_run(tmp_path / "run.gsrec", third_layer=True))
    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)
    window._refresh()
    flow = window.plots.flow
    bars = flow.bars.opts["y"]
    assert len(bars) == len(flow._order) == 3
    labels = {round(label.pos().y()): label for label in flow.name_labels if label.isVisible()}
    assert sorted(labels) == sorted(int(y) for y in bars)
    for row, label in labels.items():
        assert label.toPlainText() == flow._order[row]
        # At the bars' left end, inside the chart's view.
        (x0, x1), _ = flow.item.vb.viewRange()
        assert x0 <= label.pos().x() <= x1


def test_two_recordings_draw_both_runs_for_a_shared_layer(qtbot, window, tmp_path) -> None:
    first = record_run(tmp_path / "A.gsrec", steps=13, seed=0)
    second = record_run(tmp_path / "B.gsrec", steps=20, seed=1, third_layer=True)
    _open(qtbot, window, second)
    assert window.comparison.add_recording(first)
    plot = window.plots.gradient_norm
    shown = window.history
    with RecordingReader(first) as reader:
        _, other = reader.load()
    for layer in ("0", "2"):  # in both runs
        steps, values = plot.curves[layer].getData()
        assert np.allclose(values, _logged(shown.series("grad_norm", layer)), equal_nan=True)
        compared = plot.compared_curves[("A.gsrec", layer)]
        assert compared.isVisible()
        steps, values = compared.getData()
        assert np.array_equal(steps, other.steps)
        assert np.allclose(values, _logged(other.series("grad_norm", layer)), equal_nan=True)
        # Same layer colour, another line style.
        own_pen, other_pen = plot.curves[layer].opts["pen"], compared.opts["pen"]
        assert other_pen.color() == own_pen.color()
        assert other_pen.style() != own_pen.style()
    # The layer only B has is missing from A: no curve for it, and the run legend says so.
    assert ("A.gsrec", "3") not in plot.compared_curves
    assert plot.missing_in_compared["A.gsrec"] == ["3"]
    legend = [label.text for _, label in window.plots.loss.legend.items]
    assert any("B.gsrec" in text and "solid" in text for text in legend)
    assert any("A.gsrec" in text and "dashed" in text for text in legend)
    assert legend[legend.index(next(t for t in legend if "A.gsrec" in t)) + 1] == "missing: 3"
    # Both runs' losses, and the step axis covers both.
    assert "A.gsrec" in window.plots.loss.compared_curves
    # Another statistic: the compared curves follow the selector.
    plot.statistic_selector.choose("weight_norm")
    _, values = plot.compared_curves[("A.gsrec", "2")].getData()
    assert np.allclose(values, _logged(other.series("weight_norm", "2")), equal_nan=True)
    window.comparison.clear()
    assert not plot.compared_curves


def test_a_file_that_is_no_recording_is_refused_for_comparison(qtbot, window, tmp_path) -> None:
    _open(qtbot, window, record_run(tmp_path / "A.gsrec"))
    bad = tmp_path / "notes.gsrec"
    bad.write_text("not a recording")
    assert not window.comparison.add_recording(bad)
    assert window.comparison.runs == ()
    assert window.comparison.error_dialog is not None
    window.comparison.error_dialog.close()


def test_open_with_several_recordings_screenshots_them_together(tmp_path) -> None:
    import os
    import subprocess
    import sys

    from PySide6.QtGui import QImage

    first = record_run(tmp_path / "A.gsrec", steps=13, seed=0)
    second = record_run(tmp_path / "B.gsrec", steps=20, seed=1)
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        GRADSCOPE_WINDOW_SIZE="1280x800",
    )
    images = []
    for name, paths in (("alone", [first]), ("both", [first, second])):
        shot = tmp_path / f"{name}.png"
        command = [sys.executable, "-m", "gradscope", "open", *map(str, paths)]
        result = subprocess.run(
            [*command, "--screenshot", str(shot)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stderr
        images.append(QImage(str(shot)))
    alone, both = images
    assert (both.width(), both.height()) == (alone.width(), alone.height()) == (1280, 800)
    assert both != alone
    # A recording that is not one: refused before any window, with the usual exit code.
    bad = tmp_path / "bad.gsrec"
    bad.write_text("no")
    result = subprocess.run(
        [sys.executable, "-m", "gradscope", "open", str(first), str(bad)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 2 and "bad.gsrec" in result.stderr


def test_a_recording_shows_its_own_settings_greyed_with_nothing_to_apply(
    qtbot, window, tmp_path
) -> None:
    from gradscope.core.settings import RunSettings

    panel = window.settings_panel
    # The model shown before offered the user's last changes.
    panel.set_script_defaults(RunSettings(), {"lr": 0.5})
    assert not panel.last_overrides_button.isHidden()
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    path = tmp_path / "configured.gsrec"
    with gradscope.watch(model, record=path, settings={"lr": 0.0123, "steps": 7}) as watch:
        loss = model(torch.randn(2, 3)).square().mean()
        loss.backward()
        watch.collect(loss)
    _open(qtbot, window, path)
    shown = panel.settings()
    assert shown.lr == pytest.approx(0.0123) and shown.steps == 7
    assert panel.last_overrides_button.isHidden()
    assert not panel.reset_button.isEnabled()
    for field in (panel.lr, panel.steps, panel.batch_size, panel.explode_threshold):
        assert not field.isEnabled()  # greyed, not only read-only


def test_the_hover_label_goes_with_the_data_it_points_at(qtbot, window, tmp_path) -> None:
    from PySide6.QtCore import QPointF

    _open(qtbot, window, record_run(tmp_path / "A.gsrec"))
    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)
    window._refresh()
    plot = window.plots.gradient_norm

    def hover_a_point() -> None:
        steps, values = plot.curves["2"].getData()
        plot.item.vb.prepareForPaint()
        scene = plot.item.vb.mapViewToScene(QPointF(float(steps[5]), float(values[5])))
        plot._on_scene_mouse_moved(scene)
        assert plot.hover.isVisible() and "step 5" in plot.hover_text

    hover_a_point()
    _open(qtbot, window, record_run(tmp_path / "B.gsrec", seed=1))  # another run shown
    assert not plot.hover.isVisible() and plot.hover_text == ""
    hover_a_point()
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    QApplication.sendEvent(plot, QEvent(QEvent.Type.Leave))  # the mouse left the plot
    assert not plot.hover.isVisible()
    # Onto the statistic box over the plot's corner: the plot widget itself is not left
    # (the box is its child), its drawing area is.
    hover_a_point()
    QApplication.sendEvent(plot.widget.viewport(), QEvent(QEvent.Type.Leave))
    assert not plot.hover.isVisible() and plot.hover_text == ""


def test_empty_plots_say_how_to_start(qtbot, window, scripts) -> None:
    from tests.gui.gui_helpers import open_and_wait, run_and_wait

    open_and_wait(qtbot, window, scripts["tiny"])
    window._refresh()
    hint = window.plots.empty_hint
    assert not hint.isHidden() and "Run (F5)" in hint.text()
    # Inside the drawing area, clear of the axes and their labels (at 1280x800 the one line
    # ran over the value axis): wrapped there, one line on a wide window.
    plot = window.plots.gradient_norm
    for width in (1280, 2400):
        window.resize(width, 800)
        qtbot.wait(50)
        area = plot.widget.mapFromScene(plot.item.vb.sceneBoundingRect()).boundingRect()
        assert area.contains(hint.geometry()), (width, area, hint.geometry())
        lines = round((hint.height() - 2 * 8 - 2) / hint.fontMetrics().lineSpacing())  # padding
        assert (lines >= 2) if width == 1280 else (lines == 1), (width, lines)
    window.resize(1280, 800)
    (x0, x1), _ = window.plots.gradient_norm.item.vb.viewRange()
    assert x0 < 0 < 9 < x1  # the first steps, not -0.4 to 0.4
    # No numbers on the axes before there is data (the loss axis read 0.1 to 0.9, the norm
    # axis 5, the heatmap's steps -0.4 to 0.4): they come with the first step.
    panel = window.plots
    plots = (panel.gradient_norm, panel.loss, panel.heatmap, panel.flow)

    def axes():
        found = [panel.heatmap.colorbar.getAxis("bottom")]
        for each in plots:
            found += [each.item.getAxis("left"), each.item.getAxis("bottom")]
        return found

    assert not any(axis.style["showValues"] for axis in axes())
    run_and_wait(qtbot, window, window.step)
    window._refresh()
    assert hint.isHidden()
    assert all(axis.style["showValues"] for axis in axes())


def test_help_links_to_the_readmes_app_section(window, tmp_path) -> None:
    from gradscope.gui.help_links import app_section_url

    url = window.app_help_url
    assert window.app_help_action.isEnabled() and url is not None
    assert url.fragment() == "the-app"
    readme = Path(url.toLocalFile())
    assert "\n## The app\n" in readme.read_text(encoding="utf-8")
    help_menu = next(a.menu() for a in window.menuBar().actions() if "Help" in a.text())
    assert window.app_help_action in help_menu.actions()
    assert app_section_url(tmp_path / "README.md") is None  # none shipped: no dead link


def test_last_changes_are_offered_in_words_not_python(qtbot) -> None:
    from gradscope.core.settings import RunSettings
    from gradscope.gui.settings_panel import SettingsPanel

    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.set_settings(RunSettings())
    panel.set_script_defaults(RunSettings(), {"trace": True, "lr": 0.5})
    text = panel.last_overrides_button.text()
    assert "trace on" in text and "True" not in text


def _reference_ema(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's debiased EMA, one value at a time, over the finite values."""
    out = np.full(len(values), np.nan)
    last, count = 0.0, 0
    for i, value in enumerate(values):
        if np.isfinite(value):
            last = last * weight + (1 - weight) * value
            count += 1
            out[i] = last / (1 - weight**count)
    return out


def test_smoothing_draws_the_moving_average_over_the_faint_raw_values(
    qtbot, window, tmp_path
) -> None:
    _open(qtbot, window, record_run(tmp_path / "A.gsrec", steps=60))
    plots = window.plots
    history = window.history
    plots.smoothing_slider.setValue(80)
    assert plots.smoothing_value.text() == "0.80"
    raw = _logged(history.series("grad_norm", "2"))
    _, smoothed = plots.gradient_norm.curves["2"].getData()
    assert np.allclose(smoothed, _reference_ema(raw, 0.8), equal_nan=True)
    assert not np.allclose(smoothed, raw, equal_nan=True)
    faint = plots.gradient_norm.raw_curves["2"]
    assert faint.isVisible()
    assert np.allclose(faint.getData()[1], raw, equal_nan=True)
    assert faint.opts["pen"].color().alpha() < 255
    _, loss = plots.loss.curve.getData()
    drawn = _logged(history.losses) if plots.loss._log else history.losses  # log axis
    assert np.allclose(loss, _reference_ema(drawn, 0.8), equal_nan=True)
    assert plots.loss.raw_curve.isVisible()
    plots.smoothing_slider.setValue(0)  # off: the raw values, nothing behind them
    _, shown = plots.gradient_norm.curves["2"].getData()
    assert np.allclose(shown, raw, equal_nan=True)
    assert not faint.isVisible() and not plots.loss.raw_curve.isVisible()


def test_tree_menu_and_tick_all_matching_edit_what_every_plot_shows(qtbot, window, scripts) -> None:
    from PySide6.QtWidgets import QApplication

    from tests.gui.gui_helpers import open_and_wait, run_and_wait

    open_and_wait(qtbot, window, scripts["nan"])
    run_and_wait(qtbot, window, window.step)
    model = window.tree_model
    everything = model.watched_layers()
    encoder = [name for name in everything if name.startswith("encoder.")]
    assert encoder and len(encoder) < len(everything)
    actions = window.layer_actions
    menu = actions.menu_for("encoder")
    texts = [action.text() for action in menu.actions()]
    assert texts == [
        "Watch only encoder and below",
        "Copy name",
        "Export encoder's series as CSV…",
    ]
    menu.actions()[0].trigger()
    assert model.watched_layers() == encoder
    assert window.settings_panel.settings().layers == encoder  # the engine is told
    window._refresh()
    # Every plot drops the unticked layers, not only the gradient-norm plot.
    assert window.plots.heatmap._order == encoder
    assert window.plots.flow._order == encoder
    menu.actions()[1].trigger()
    assert QApplication.clipboard().text() == "encoder"
    # "Tick all matching" the filter.
    assert not actions.tick_matching_button.isEnabled()
    window.filter_edit.setText("head")
    assert actions.tick_matching_button.isEnabled()
    actions.tick_matching_button.click()
    assert model.watched_layers() == [n for n in everything if n in {*encoder, "head"}]
    window.filter_edit.setText("no such module")
    assert not actions.tick_matching_button.isEnabled()


def test_recording_names_and_the_data_folder_read_well(monkeypatch) -> None:
    from gradscope.gui.recordings import recording_stem, runs_folder

    assert recording_stem("timm:resnet18") == "timm-resnet18"
    assert recording_stem("hf:./my/model") == "hf-my-model"
    assert recording_stem("resnet18") == "resnet18"
    assert recording_stem("/tmp/x/my_model.py") == "my_model"
    monkeypatch.delenv("GRADSCOPE_RUNS_DIR")
    folder = runs_folder()
    assert folder.name == "runs" and folder.parent.name == "GradScope"
    assert folder.parent.parent.name != "GradScope"  # not GradScope/GradScope


def test_the_file_menu_tells_recent_models_from_recorded_runs(window) -> None:
    file_menu = window.file_menu
    titles = [a.text().replace("&", "") for a in file_menu.actions() if a.menu() is not None]
    recent = [title for title in titles if "Recent" in title]
    assert sorted(recent) == ["Recent models", "Recent recorded runs"]


FAILS_AT_ONCE = """
import torch
from torch import nn

CONFIG = {"steps": 5, "batch_size": 2, "device": "cpu", "rewind_depth": 2}


def build_model():
    return nn.Linear(3, 1)


def make_batch(batch_size, device):
    return torch.randn(batch_size, 4), torch.randn(batch_size, 1)  # 4 features, not 3
"""


def test_toolbar_offers_only_what_makes_sense(qtbot, window, scripts, tmp_path) -> None:
    from tests.gui.gui_helpers import open_and_wait, run_and_wait

    script = tmp_path / "fails_at_once.py"
    script.write_text(FAILS_AT_ONCE)
    open_and_wait(qtbot, window, str(script))
    with qtbot.waitSignal(window.error_shown, timeout=30_000):
        window.run()
    qtbot.waitUntil(lambda: window.state == "step_failed", timeout=10_000)
    assert window.history.count == 0
    assert window.run_action.text().replace("&", "") == "Run"  # nothing to continue
    assert not window.debugger.rewind_action.isEnabled()
    window.error_dialog.close()
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.run)
    qtbot.waitUntil(lambda: window.state == "done", timeout=10_000)
    assert not window.stop_action.isEnabled()  # finished: nothing to stop


def test_a_short_plot_keeps_its_curves_and_gives_the_legend_less(qtbot, tmp_path) -> None:
    from gradscope.gui.plots import GradientNormPlot, PlotView, layer_color

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(12)])
    path = tmp_path / "deep.gsrec"
    with gradscope.watch(model, record=path) as watch:
        for _ in range(5):
            loss = model(torch.randn(2, 4)).square().mean()
            loss.backward()
            watch.collect(loss)
            model.zero_grad()
    with RecordingReader(path) as reader:
        _, history = reader.load()
    names = list(history.layer_names)
    plot = GradientNormPlot()
    qtbot.addWidget(plot)
    view = PlotView(
        history=history,
        order=names,
        visible=set(names),
        colors={n: layer_color(i) for i, n in enumerate(names)},
    )

    def entries(width: int, height: int) -> list[str]:
        plot.resize(width, height)
        plot.show()
        qtbot.waitExposed(plot)
        plot.refresh(view)
        return [label.text for _, label in plot.legend.items]

    tall = entries(900, 700)
    assert len(tall) == 8 and tall[-1] == "+5 more ▸"
    short = entries(600, 300)
    assert len(short) < len(tall) and short[-1].startswith("+")
    # The plot's view keeps most of the height.
    assert plot.item.vb.height() > 300 * 0.4


def test_trace_pane_and_image_size_show_only_where_they_apply(
    qtbot, window, scripts, tmp_path
) -> None:
    from tests.gui.gui_helpers import open_and_wait

    panel = window.settings_panel
    open_and_wait(qtbot, window, scripts["tiny"])
    assert not panel._form.isRowVisible(panel.image_size)  # a script makes its batches
    if panel.trace is None:
        pytest.skip("this engine has no trace mode")
    panel.trace.setChecked(True)
    window.debugger.trace_dock.show()
    panel.trace.setChecked(False)  # trace mode off: the empty pane goes
    assert not window.debugger.trace_dock.isVisible()
    _open(qtbot, window, record_run(tmp_path / "A.gsrec"))
    assert not panel._form.isRowVisible(panel.image_size)


def test_image_size_is_offered_for_a_torchvision_model(qtbot, window) -> None:
    from tests.gui.gui_helpers import open_and_wait

    open_and_wait(qtbot, window, "squeezenet1_0")
    panel = window.settings_panel
    assert panel._form.isRowVisible(panel.image_size)


def test_top_k_layers_by_norm_and_by_status(qtbot, window, tmp_path) -> None:
    from gradscope.gui.plots.top_layers import TOP_K

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(TOP_K + 4)])
    path = tmp_path / "deep.gsrec"
    with gradscope.watch(model, record=path) as watch:
        for _ in range(4):
            loss = model(torch.randn(2, 4)).square().mean()
            loss.backward()
            watch.collect(loss)
            model.zero_grad()
    _open(qtbot, window, path)
    history = window.history
    plots = window.plots
    names = list(history.layer_names)
    last = history.matrix("grad_norm")[-1]
    by_norm = sorted(names, key=lambda n: float(last[history.column(n)]), reverse=True)
    plots.layer_choice.setCurrentIndex(plots.layer_choice.findData("norm"))
    shown = [n for n, c in plots.gradient_norm.curves.items() if c.isVisible()]
    assert sorted(shown) == sorted(by_norm[:TOP_K])
    assert plots.heatmap._order == [n for n in names if n in by_norm[:TOP_K]]
    plots.layer_choice.setCurrentIndex(plots.layer_choice.findData("status"))
    worst = history.worst_status
    expected = sorted(
        names,
        key=lambda n: (int(worst[history.column(n)]), float(last[history.column(n)])),
        reverse=True,
    )[:TOP_K]
    assert sorted(plots.heatmap._order) == sorted(expected)
    plots.layer_choice.setCurrentIndex(plots.layer_choice.findData("ticked"))
    assert plots.heatmap._order == names


def test_right_click_on_a_curve_opens_that_layers_menu(qtbot, window, tmp_path) -> None:
    from PySide6.QtCore import QPointF, Qt

    _open(qtbot, window, record_run(tmp_path / "A.gsrec"))
    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)
    window._refresh()
    plot = window.plots.gradient_norm
    plot.item.vb.prepareForPaint()
    steps, values = plot.curves["2"].getData()
    scene = plot.item.vb.mapViewToScene(QPointF(float(steps[6]), float(values[6])))
    point = plot.widget.mapFromScene(scene)
    with qtbot.waitSignal(plot.layer_menu_requested, timeout=5_000) as blocker:
        qtbot.mouseClick(plot.widget.viewport(), Qt.MouseButton.RightButton, pos=point)
    assert blocker.args[0] == "2"
    menu = window.layer_actions.menu
    assert menu is not None and menu.isVisible()
    assert menu.actions()[0].text() == "Watch only 2 and below"
    menu.close()


def test_small_leftovers_are_gone(qtbot, window, tmp_path) -> None:
    from gradscope.core.origin import Origin
    from gradscope.gui.diagnosis_pane import DiagnosisPane

    # Diagnosis: no pink line left from an origin with a source when the next has none.
    pane = DiagnosisPane()
    qtbot.addWidget(pane)
    pane.show_origin(Origin(3, "forward", "fc", "output", "nan", file=__file__, line=5))
    assert pane.source.extraSelections()
    pane.show_origin(Origin(4, "input", None, "inputs", "inf"))
    assert pane.source.extraSelections() == []
    # Flow chart: the thresholds are named under the axis, not in boxes over the bars.
    flow = window.plots.flow
    assert not hasattr(flow.explode_line, "label") and not hasattr(flow.vanish_line, "label")
    assert "vanish" in flow.item.getAxis("bottom").labelText
    # The last run's cursor and colour scale go with it.
    _open(qtbot, window, record_run(tmp_path / "A.gsrec"))
    window.select(layer="2", step=4)
    window._refresh()
    assert window.plots.heatmap.step_line.isVisible()
    _open(qtbot, window, record_run(tmp_path / "B.gsrec", seed=1))
    plots = window.plots
    line = plots.gradient_norm.step_line  # the new run's step, if any, not step 4 of A's
    assert not line.isVisible() or line.value() == float(window.history.steps[-1])
    assert not plots.heatmap.layer_line.isVisible()


def test_each_plot_has_a_log_or_linear_value_axis(qtbot, window, tmp_path) -> None:
    _open(qtbot, window, record_run(tmp_path / "A.gsrec"))
    plots = window.plots
    history = window.history
    raw = history.series("grad_norm", "2").astype(np.float64)
    plot = plots.gradient_norm
    plot.scale_choice.setCurrentIndex(1)  # linear
    assert plot.linear and not plot.item.getAxis("left").logMode
    _, shown = plot.curves["2"].getData()
    assert np.allclose(shown, raw, rtol=1e-5)
    plot.scale_choice.setCurrentIndex(0)  # log again
    _, shown = plot.curves["2"].getData()
    assert np.allclose(shown, _logged(raw), equal_nan=True)
    loss = plots.loss
    for choice, logged in (("log", True), ("linear", False)):
        loss.scale_choice.setCurrentText(choice)
        _, y = loss.curve.getData()
        expected = _logged(history.losses) if logged else history.losses
        assert np.allclose(y, expected, equal_nan=True)
        assert loss.item.getAxis("left").logMode == logged


def test_a_rewound_branch_stays_drawn_beside_the_new_one(qtbot, window, scripts) -> None:
    from tests.gui.gui_helpers import RUN_TIMEOUT, open_and_wait, run_and_wait

    open_and_wait(qtbot, window, scripts["tiny"], rewind_depth=5)
    run_and_wait(qtbot, window, window.run)
    before = window.history.losses.copy()
    layer = window.history.layer_names[0]
    with qtbot.waitSignal(window.debugger.rewound, timeout=RUN_TIMEOUT):
        assert window.debugger.rewind(2)
    qtbot.waitUntil(lambda: window.state != "running", timeout=RUN_TIMEOUT)
    runs = window.comparison.runs
    assert [run.name for run in runs] == ["branch 2-4 (rewound)"]
    assert np.array_equal(runs[0].history.losses, before)  # the whole abandoned branch
    assert list(window.history.steps) == [0, 1]
    window._refresh()
    curve = window.plots.gradient_norm.compared_curves[("branch 2-4 (rewound)", layer)]
    steps, _ = curve.getData()
    assert list(steps) == [0, 1, 2, 3, 4]
