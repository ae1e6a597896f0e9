"""Issue 38: compared runs drawn honestly, and views that follow what is shown."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch
from test_plots import _history, _view
from torch import nn

import gradscope


def record_blow_up(path: Path, steps: int = 12, nan_at: int = 7) -> Path:
    """A small MLP's real run recorded to ``path``, its batch NaN at step ``nan_at`` (the
    weights are NaN from then on: the run blew up, it did not end)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with gradscope.watch(model, record=path) as watch:
        for step in range(steps):
            inputs = torch.randn(16, 4)
            if step == nan_at:
                inputs[0, 0] = float("nan")
            loss = nn.functional.mse_loss(model(inputs), inputs.sum(1, keepdim=True))
            loss.backward()
            watch.collect(loss)
            optimizer.step()
            optimizer.zero_grad()
    return path


def test_a_heatmap_of_one_layer_is_drawn(qtbot) -> None:
    from gradscope.gui.plots import HeatmapPlot

    names, history, _ = _history(layers=3, steps=30)
    heatmap = HeatmapPlot()
    qtbot.addWidget(heatmap)
    heatmap.resize(600, 400)
    heatmap.show()
    heatmap.refresh(_view(names, history, visible=[names[1]]))
    heatmap.image.render()
    image = heatmap.image.qimage
    assert image is not None and image.width() == 30 and image.height() >= 1
    # Each step's cell carries the colour computed for it (not blank).
    for step in (0, 17, 29):
        color = image.pixelColor(step, 0)
        assert (color.red(), color.green(), color.blue()) == tuple(heatmap.rgba[step, 0, :3])


def test_a_rewound_branch_stays_with_its_model(qtbot, window, scripts) -> None:
    from gui_helpers import RUN_TIMEOUT, open_and_wait, run_and_wait

    open_and_wait(qtbot, window, scripts["tiny"], rewind_depth=5)
    run_and_wait(qtbot, window, window.run)
    with qtbot.waitSignal(window.debugger.rewound, timeout=RUN_TIMEOUT):
        assert window.debugger.rewind(2)
    qtbot.waitUntil(lambda: window.state != "running", timeout=RUN_TIMEOUT)
    assert [run.name for run in window.comparison.runs] == ["branch 2-4 (rewound)"]
    # Another model: its plots start clean, without the old branch or its legend.
    open_and_wait(qtbot, window, scripts["nan"])
    window._refresh()
    assert window.comparison.runs == ()
    assert not window.plots.loss.compared_curves
    assert not window.plots.gradient_norm.compared_curves
    legend = [label.text for _, label in window.plots.loss.legend.items]
    assert not any("rewound" in text or "missing" in text for text in legend)


def test_a_compared_recording_leaves_with_its_model_unless_pinned(
    qtbot, window, scripts, tmp_path
) -> None:
    from gui_helpers import open_and_wait
    from test_dashboard_plots import record_run

    first = record_run(tmp_path / "A.gsrec", steps=13, seed=0)
    second = record_run(tmp_path / "B.gsrec", steps=30, seed=1)
    assert window.recordings.open_recording(second)
    assert window.comparison.add_recording(first)
    open_and_wait(qtbot, window, scripts["tiny"])
    assert window.comparison.runs == ()
    assert not window.comparison.clear_action.isEnabled()
    # Pinned, a compared run stays through a model change.
    assert window.recordings.open_recording(second)
    assert window.comparison.add_recording(first)
    window.comparison.pin_action.setChecked(True)
    open_and_wait(qtbot, window, scripts["tiny"])
    assert [run.name for run in window.comparison.runs] == ["A.gsrec"]


def test_skipped_steps_are_skipped_in_the_per_parameter_view_too(qtbot, window, scripts) -> None:
    from pathlib import Path

    from gui_helpers import open_and_wait, run_and_wait

    from gradscope.gui.mixed_precision import SKIPPED_WORDS

    sample = Path(__file__).resolve().parents[2] / "sample_models/fp16_scaler_healthy_skips.py"
    open_and_wait(qtbot, window, str(sample), steps=10)
    run_and_wait(qtbot, window, window.run)
    norm = window.plots.gradient_norm
    norm.statistic_selector.choose("param_grad_norm")
    window._refresh()
    assert norm.per_parameter and norm.curves
    assert norm.skipped.steps.tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert norm._edge_points == []  # no NaN/Inf marker: they are the scaler's skips
    legend = [label.text for _, label in norm.legend.items]
    assert SKIPPED_WORDS in legend
    # The next model has no scaler: the heatmap's title no longer explains purple cells.
    assert "purple" in window.plots.heatmap.item.titleLabel.text
    open_and_wait(qtbot, window, scripts["tiny"])
    window._refresh()
    assert "purple" not in window.plots.heatmap.item.titleLabel.text


def test_a_compared_run_that_blew_up_carries_its_own_markers(qtbot, window, tmp_path) -> None:
    from test_dashboard_plots import record_run

    shown = record_run(tmp_path / "C.gsrec", steps=12, seed=0)
    blown = record_blow_up(tmp_path / "A.gsrec", steps=12, nan_at=7)
    assert window.recordings.open_recording(shown)
    assert window.comparison.add_recording(blown)
    window._refresh()
    norm, loss = window.plots.gradient_norm, window.plots.loss
    assert norm._edge_points == []  # the shown run is healthy
    # Every step from 7 on is NaN in the compared run: a marker each, on both plots.
    expected = [("A.gsrec", step) for step in range(7, 12)]
    assert norm.compared_marks.nonfinite_points == expected
    assert loss.compared_marks.nonfinite_points == expected
    # A line in the run's own style where it blew up.
    line = norm.compared_marks.first_lines["A.gsrec"]
    assert line.value() == 7 and line.pen.style() == window.comparison.runs[0].line_style
    assert loss.compared_marks.first_lines["A.gsrec"].value() == 7
    legend = [label.text for _, label in norm.legend.items]
    assert any("compared run" in text and "NaN/Inf" in text for text in legend)
    # Its own origin, in the run legend and above the Events list (a link to it).
    origin = window.comparison.runs[0].history.first_nonfinite
    assert origin is not None and origin.step == 7
    run_legend = [label.text for _, label in loss.legend.items]
    assert any(text.startswith("NaN/Inf from step 7") for text in run_legend), run_legend
    from PySide6.QtCore import Qt

    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)
    label = next(lb for _, lb in loss.legend.items if lb.text.startswith("NaN/Inf from step 7"))
    point = loss.widget.mapFromScene(label.sceneBoundingRect().center())
    with qtbot.waitSignal(loss.selection_made) as clicked:
        qtbot.mouseClick(loss.widget.viewport(), Qt.MouseButton.LeftButton, pos=point)
    assert (clicked.args[0].layer, clicked.args[0].step) == (origin.module, 7)
    note = window.events_panel.compared_note
    assert note.isVisible() and "A.gsrec" in note.text() and "step 7" in note.text()
    with qtbot.waitSignal(window.events_panel.selection_made) as blocker:
        note.linkActivated.emit("0")
    assert blocker.args[0].step == 7
    # Gone with the run.
    window.comparison.clear()
    assert not window.events_panel.compared_note.isVisible()
    assert norm.compared_marks.nonfinite_points == []
    assert not norm.compared_marks.first_lines and not loss.compared_marks.first_lines


def test_a_compared_recording_still_being_written_follows_its_writer(
    qtbot, window, tmp_path
) -> None:
    from test_dashboard_plots import record_run
    from test_recordings_in_app import TIMEOUT, _write

    from gradscope.core.recording import RecordingReader

    shown = record_run(tmp_path / "C.gsrec", steps=12, seed=0)
    path, child = _write(tmp_path, steps=400, pause=0.02)
    try:
        assert child.stdout is not None
        child.stdout.readline()
        qtbot.waitUntil(lambda: RecordingReader(path).row_count() > 0, timeout=TIMEOUT)
        assert window.recordings.open_recording(shown)
        assert window.comparison.add_recording(path)
        run = window.comparison.runs[0]
        first = run.history.count
        qtbot.waitUntil(lambda: run.history.count > first + 5, timeout=TIMEOUT)
        qtbot.waitUntil(
            lambda: (
                window.plots.loss.compared_curves["live.gsrec"].getData()[0] is not None
                and len(window.plots.loss.compared_curves["live.gsrec"].getData()[0])
                == run.history.count
            ),
            timeout=TIMEOUT,
        )
    finally:
        child.kill()
        child.wait()
    window.comparison.clear()
    assert not window.comparison.followed and not window.comparison.follow_timer.isActive()


def test_the_row_axes_refit_when_top_10_cuts_the_layers_after_a_zoom(qtbot) -> None:
    from gradscope.gui.plots import PlotPanel

    names, history, _ = _history(layers=30, steps=40)
    panel = PlotPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 700)
    panel.show()
    panel.refresh(_view(names, history))
    assert panel.heatmap.item.vb.viewRange()[1] == [-0.5, 29.5]
    panel.gradient_norm.item.vb.sigRangeChangedManually.emit([True, False])  # a zoom
    assert not panel.follow_range
    panel.layer_choice.setCurrentIndex(panel.layer_choice.findData("norm"))
    assert panel.heatmap.item.vb.viewRange()[1] == [-0.5, 9.5]
    # The flow chart's rows are the heatmap's (linked, aligned on screen; its view is a
    # little taller, with no colour bar under it).
    low, high = panel.flow.item.vb.viewRange()[1]
    assert low == -0.5 and 9.5 <= high < 12


def test_the_loss_plot_reads_out_the_step_under_the_mouse(qtbot, window, tmp_path) -> None:
    from PySide6.QtCore import QPointF
    from test_dashboard_plots import record_run

    from gradscope.gui.status_style import format_value

    shown = record_run(tmp_path / "C.gsrec", steps=12, seed=0)
    assert window.recordings.open_recording(shown)
    assert window.comparison.add_recording(record_blow_up(tmp_path / "A.gsrec", nan_at=7))
    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)
    window._refresh()
    loss = window.plots.loss
    loss.item.vb.prepareForPaint()
    x, y = loss.curve.getData()
    scene = loss.item.vb.mapViewToScene(QPointF(float(x[9]), float(y[9])))
    loss._on_scene_mouse_moved(scene)
    assert loss.hover.isVisible()
    expected = format_value(float(window.history.losses[9]))
    assert loss.hover_text.splitlines() == ["step 9", f"loss = {expected}", "A.gsrec: NaN"]
    window.plots.hide_hover()
    assert not loss.hover.isVisible() and loss.hover_text == ""


def test_a_click_on_more_lists_every_layer_in_the_legend(qtbot) -> None:
    from PySide6.QtCore import Qt

    from gradscope.gui.plots import GradientNormPlot

    names, history, _ = _history(layers=20, steps=30)
    plot = GradientNormPlot()
    qtbot.addWidget(plot)
    plot.resize(900, 600)
    plot.show()
    plot.refresh(_view(names, history))
    qtbot.wait(20)

    def labels() -> list[str]:
        return [label.text for _, label in plot.legend.items]

    def click(text: str) -> None:
        label = next(label for _, label in plot.legend.items if label.text == text)
        center = label.sceneBoundingRect().center()
        point = plot.widget.mapFromScene(center)
        qtbot.mouseClick(plot.widget.viewport(), Qt.MouseButton.LeftButton, pos=point)

    folded = labels()
    more = next(text for text in folded if text.startswith("+"))
    assert more.endswith("more ▸") and len(folded) < 20
    click(more)
    # Every curve named, then the markers' entries as before.
    assert labels()[:21] == [*names, "◂ fewer"], str(labels())
    assert labels()[21:] == folded[folded.index(more) + 1 :]
    click("◂ fewer")
    assert labels() == folded


def test_a_window_of_the_whole_screen_is_fitted_frame_and_all_once_shown(
    qtbot, preferences
) -> None:
    from PySide6.QtGui import QGuiApplication

    from gradscope.gui.app import configure_plots
    from gradscope.gui.main_window import MainWindow

    configure_plots()
    room = QGuiApplication.primaryScreen().availableGeometry()
    window = MainWindow(preferences)
    qtbot.addWidget(window)
    # As launch sizes it on a small screen (its client area the whole screen), plus more.
    window.resize(room.width() + 50, room.height() + 40)
    window.fit_to_screen_when_shown()
    window.show()
    qtbot.waitUntil(lambda: room.contains(window.frameGeometry()), timeout=2000)
    window.close()


def test_a_filter_that_matches_nothing_in_the_new_model_says_so(qtbot, window, scripts) -> None:
    from gui_helpers import open_and_wait

    open_and_wait(qtbot, window, scripts["nan"])
    window.filter_edit.setText("encoder")
    assert window.tree_proxy.rowCount() > 0 and not window.filter_hint.isVisible()
    open_and_wait(qtbot, window, scripts["tiny"])  # no layer named encoder here
    assert window.tree_proxy.rowCount() == 0
    assert window.filter_hint.isVisible() and "encoder" in window.filter_hint.text()
    window.filter_hint.linkActivated.emit("clear")
    assert window.filter_edit.text() == "" and not window.filter_hint.isVisible()
    assert window.tree_proxy.rowCount() > 0


def test_the_flow_chart_names_of_104_layers_do_not_overlap(qtbot) -> None:
    from gradscope.gui.plots import GradientFlowPlot

    names, history, _ = _history(layers=104, steps=3)
    flow = GradientFlowPlot()
    qtbot.addWidget(flow)
    flow.resize(290, 300)  # its share of a 1280x800 window
    flow.show()
    qtbot.waitExposed(flow)
    view = _view(names, history)
    flow.refresh(view)
    flow.item.setYRange(-0.5, 103.5, padding=0)
    qtbot.wait(50)
    shown = [label for label in flow.name_labels if label.isVisible()]
    assert 4 <= len(shown) < 104
    boxes = sorted((label.sceneBoundingRect() for label in shown), key=lambda r: r.top())
    for upper, lower in itertools.pairwise(boxes):
        assert upper.bottom() <= lower.top() + 0.5, (upper, lower)


def test_start_without_arguments_offers_a_zoo_model_rather_than_building_it(
    window, preferences
) -> None:
    from gradscope.gui.app import default_model, offer_reopen, script_to_offer

    for name in ("hf:bert", "timm:convnext_tiny"):
        preferences.setValue("model/last", name)
        assert default_model(preferences) is None  # nothing built at start
        assert script_to_offer(preferences) == name
    action = offer_reopen(window, "hf:bert", {})
    assert action.text() == "Reopen hf:bert"
    preferences.setValue("model/last", "resnet18")  # a torchvision name reopens as before
    assert default_model(preferences) == "resnet18"


def test_a_sample_description_shows_no_raw_markup(qtbot, window) -> None:
    from gui_helpers import open_and_wait

    sample = Path(__file__).resolve().parents[2] / "sample_models/backward_sqrt_of_zero.py"
    open_and_wait(qtbot, window, str(sample))
    notes = window.settings_panel.model_notes.text()
    assert "sqrt" in notes and "``" not in notes


def test_a_detail_statistic_measured_every_step_is_a_line_not_loose_dots(
    qtbot, window, tmp_path
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "every.gsrec"
    with gradscope.watch(model, record=path, detail_every=1) as watch:
        for _ in range(60):  # more than DOTS_UP_TO: a line, not dots, unless sparse
            inputs = torch.randn(16, 4)
            loss = nn.functional.mse_loss(model(inputs), inputs.sum(1, keepdim=True))
            loss.backward()
            watch.collect(loss)
            optimizer.step()
            optimizer.zero_grad()
    from test_dashboard_plots import record_run

    sparse = record_run(tmp_path / "sparse.gsrec", steps=60)  # detail every 3rd step
    plot = window.plots.gradient_norm
    for recording, dots in ((path, None), (sparse, "o")):
        assert window.recordings.open_recording(recording)
        plot.statistic_selector.choose("weight_norm")
        window._refresh()
        curve = plot.curves["2"]
        assert curve.isVisible() and curve.opts["symbol"] == dots, recording


def test_a_curve_that_is_all_nan_leaves_the_terminal_quiet(qtbot) -> None:
    import warnings

    import pyqtgraph as pg

    from gradscope.gui.app import configure_plots

    configure_plots()
    # (pyqtgraph's curves silence it themselves; its scatter items do not)
    markers = pg.ScatterPlotItem(x=np.arange(5.0), y=np.full(5, np.nan))
    with warnings.catch_warnings(record=True) as caught:
        markers.dataBounds(1)
    assert not [w for w in caught if "All-NaN" in str(w.message)]


def test_a_failed_open_over_a_recording_keeps_the_recording_named(
    qtbot, window, scripts, tmp_path
) -> None:
    from gui_helpers import LOAD_TIMEOUT
    from test_dashboard_plots import record_run

    assert window.recordings.open_recording(record_run(tmp_path / "C.gsrec", steps=8))
    with qtbot.waitSignal(window.error_shown, timeout=LOAD_TIMEOUT):
        window.open_model(scripts["broken"])
    window.error_dialog.close()
    assert window.model_label.text() == "C.gsrec"
    assert window.state == "recording" and window.history.count == 8
