"""Issue 27's dashboard, continued: the wall-clock x axis (time since the run's first step),
greyed with a reason for a recording without step times; and each parameter's gradient norm
in the gradient-norm plot's selector. Real runs of a small MLP, live and recorded."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import gradscope
from gradscope.gui.plot_axes import GridAxis, elapsed_text, time_tick_values


def record_run(path: Path, steps: int = 8, pause_at: int | None = None) -> Path:
    """A small MLP's training run recorded to ``path``; with ``pause_at`` the loop sleeps
    0.3 s before that step (a pause a wall-clock axis shows and a step axis does not)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with gradscope.watch(model, record=path) as watch:
        for step in range(steps):
            if step == pause_at:
                time.sleep(0.3)
            inputs = torch.randn(16, 4)
            loss = nn.functional.mse_loss(model(inputs), inputs.sum(1, keepdim=True))
            loss.backward()
            watch.collect(loss)
            optimizer.step()
            optimizer.zero_grad()
    return path


def _without_step_times(path: Path) -> Path:
    """The file as a GradScope from before step times wrote it."""
    connection = sqlite3.connect(path)
    for table in ("params", "param_sets", "param_grad_norm"):
        connection.execute(f"DROP TABLE {table}")
    connection.execute("ALTER TABLE steps DROP COLUMN wall_time")
    connection.commit()
    connection.close()
    return path


def _open(window, path: Path) -> None:
    assert window.recordings.open_recording(path)
    window._refresh()


def test_wall_clock_axis_draws_steps_at_their_time_since_the_first(qtbot, window, tmp_path):
    path = record_run(tmp_path / "run.gsrec", pause_at=5)
    _open(window, path)
    plots = window.plots
    history = window.history
    choice = plots.x_axis_choice
    assert choice.model().item(1).isEnabled()
    steps, _ = plots.gradient_norm.curves["2"].getData()
    assert np.array_equal(steps, history.steps)  # steps by default

    choice.setCurrentIndex(1)
    window._refresh()
    assert plots.wall_clock
    elapsed = history.wall_time[: history.count] - history.wall_time[0]
    x, _ = plots.gradient_norm.curves["2"].getData()
    np.testing.assert_allclose(x, elapsed)
    assert x[5] - x[4] >= 0.3  # the pause is where it happened
    loss_x, _ = plots.loss.curve.getData()
    np.testing.assert_allclose(loss_x, elapsed)
    axis = plots.gradient_norm.item.getAxis("bottom")
    assert axis.time_ticks and axis.labelText == "time since the first step"
    # The view spans the run's seconds, not its steps.
    (x0, x1), _ = plots.gradient_norm.item.vb.viewRange()
    assert x0 <= 0 and 10 <= x1 < 11
    # A selected step's cursor is at its time; the heatmap keeps steps (its columns).
    plots.show_selection("2", 6)
    assert plots.gradient_norm.step_line.value() == float(x[6])
    assert plots.loss.step_line.value() == float(x[6])
    assert plots.heatmap.item.getAxis("bottom").labelText == "step"
    (h0, h1), _ = plots.heatmap.item.vb.viewRange()
    assert h0 < 0 and h1 >= 7

    choice.setCurrentIndex(0)
    window._refresh()
    steps, _ = plots.gradient_norm.curves["2"].getData()
    assert np.array_equal(steps, history.steps)
    plots.show_selection("2", 6)
    assert plots.gradient_norm.step_line.value() == 6


def test_wall_clock_is_greyed_with_a_reason_for_an_older_recording(qtbot, window, tmp_path):
    path = _without_step_times(record_run(tmp_path / "older.gsrec"))
    _open(window, path)
    choice = window.plots.x_axis_choice
    item = choice.model().item(1)
    assert not item.isEnabled()
    assert "did not stamp each step's time" in item.toolTip()
    assert "did not stamp each step's time" in choice.toolTip()
    # A newer recording offers it again.
    _open(window, record_run(tmp_path / "newer.gsrec"))
    assert item.isEnabled() and "did not stamp" not in choice.toolTip()


def test_a_compared_run_without_step_times_greys_wall_clock_and_steps_come_back(
    qtbot, window, tmp_path
):
    _open(window, record_run(tmp_path / "a.gsrec"))
    plots = window.plots
    plots.x_axis_choice.setCurrentIndex(1)
    window._refresh()
    older = _without_step_times(record_run(tmp_path / "b.gsrec"))
    assert window.comparison.add_recording(older)
    window._refresh()
    assert not plots.wall_clock
    assert not plots.x_axis_choice.model().item(1).isEnabled()
    assert "b.gsrec" in plots.x_axis_choice.toolTip()


def test_time_ticks_read_as_a_clock() -> None:
    assert elapsed_text(5) == "0:00:05"
    assert elapsed_text(90 * 60) == "1:30:00"
    assert elapsed_text(1.5, spacing=0.5) == "0:00:01.5"
    assert elapsed_text(2 * 86400 + 3600) == "2d 1:00:00"
    (major, values), _ = time_tick_values(0, 3600, 800)
    assert major == 600 and values == [0, 600, 1200, 1800, 2400, 3000, 3600]
    axis = GridAxis("bottom")
    axis.set_time_ticks(True)
    axis.setRange(0, 100)
    levels = axis.tickValues(0, 100, 600)
    assert axis.tickStrings(levels[0][1], 1, levels[0][0])[:2] == ["0:00:00", "0:00:15"]
    assert set(axis.tickStrings(levels[1][1], 1, levels[1][0])) == {None}


def test_gradient_norm_selector_shows_each_parameters_norm(qtbot, window, tmp_path):
    path = record_run(tmp_path / "run.gsrec")
    _open(window, path)
    plots = window.plots
    norm = plots.gradient_norm
    history = window.history
    norm.statistic_selector.choose("param_grad_norm")
    window._refresh()
    assert norm.per_parameter
    shown = {name for name, curve in norm.curves.items() if curve.isVisible()}
    assert shown == {"0.weight", "0.bias", "2.weight", "2.bias"}
    parameters = history.parameter_norms
    for name in shown:
        x, y = norm.curves[name].getData()
        assert np.array_equal(x, history.steps)
        np.testing.assert_allclose(y, np.log10(parameters.series("grad_norm", name)), rtol=1e-6)
    # The layer's norm is the root of its parameters' squared norms: the curves are the
    # parameters', not the layer's.
    layer = history.series("grad_norm", "2")
    weight, bias = (parameters.series("grad_norm", n) for n in ("2.weight", "2.bias"))
    np.testing.assert_allclose(layer, np.hypot(weight, bias), rtol=1e-5)
    assert not np.allclose(weight, layer)
    # Unticking a layer takes its parameters out; the heatmap still shows layers.
    from PySide6.QtCore import Qt

    model = window.tree_model
    model.setData(model.index_of("0"), Qt.CheckState.Unchecked, Qt.ItemDataRole.CheckStateRole)
    window._refresh()
    shown = {name for name, curve in norm.curves.items() if curve.isVisible()}
    assert shown == {"2.weight", "2.bias"}
    assert plots.heatmap._order == ["2"]
    # Back to the layers.
    norm.statistic_selector.choose("grad_norm")
    window._refresh()
    shown = {name for name, curve in norm.curves.items() if curve.isVisible()}
    assert shown == {"2"}


def test_per_parameter_choice_on_a_recording_without_them_says_so(qtbot, window, tmp_path):
    _open(window, _without_step_times(record_run(tmp_path / "older.gsrec")))
    norm = window.plots.gradient_norm
    norm.statistic_selector.choose("param_grad_norm")
    window._refresh()
    assert "none stored in this recording" in norm.item.titleLabel.text
    assert not any(curve.isVisible() for curve in norm.curves.values())


def test_a_live_run_keeps_each_parameters_norm_and_its_time(qtbot, window, scripts):
    from tests.gui.gui_helpers import open_and_wait, run_and_wait

    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.run)
    history = window.history
    assert history.count == 5 and history.has_wall_time()
    assert history.parameter_norms.layer_names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert history.parameter_norms.count == 5
    assert np.isfinite(history.parameter_norms.matrix()).all()


def test_a_decimated_recordings_heatmap_spans_its_steps(qtbot, tmp_path):
    """Seen on the way (a 6,000-step recording opened decimated to 3,295 rows): the heatmap
    drew one column per row from step 0, so it ended at step 3,295."""
    from PySide6.QtCore import QPointF

    from gradscope.core.recording import RecordingReader
    from gradscope.gui.plots import HeatmapPlot, PlotView, layer_color

    path = record_run(tmp_path / "long.gsrec", steps=90)
    _, history = RecordingReader(path).load(max_rows=30)
    assert history.count < 60 and int(history.steps[-1]) == 89
    plot = HeatmapPlot()
    qtbot.addWidget(plot)
    plot.resize(600, 300)
    plot.show()
    names = history.layer_names
    plot.refresh(PlotView(history, list(names), set(names),
                          colors={n: layer_color(i) for i, n in enumerate(names)}))
    rect = plot.image.mapRectToParent(plot.image.boundingRect())
    assert rect.left() == -0.5 and abs(rect.right() - 89.5) < 3
    plot.item.setXRange(-0.5, 89.5, padding=0)
    vb = plot.item.vb
    cell = plot.cell_at(vb.mapViewToScene(QPointF(85, 0)))
    assert cell is not None and 80 <= cell[1] <= 89
