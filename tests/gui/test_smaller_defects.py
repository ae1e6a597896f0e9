"""The smaller defects of issue 15 (item 12), each with a test that failed before its fix."""

from __future__ import annotations

from gui_helpers import RUN_TIMEOUT, open_and_wait, run_and_wait


def test_continue_after_a_nan_pause_runs_on(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["nan"])  # 20 steps, NaN/Inf from step 2
    assert run_and_wait(qtbot, window, window.run).reason == "nonfinite"
    assert window.state == "halted" and window.history.count == 3
    paused = run_and_wait(qtbot, window, window.run)  # Continue
    assert paused.reason == "completed" and window.history.count == 20
    assert window.state == "done"


def test_a_step_is_paused_not_finished_and_a_failed_step_says_so(qtbot, window, scripts):
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.step)
    assert window.state == "paused" and "Paused" in window.state_label.text()
    assert window.run_action.text() == "&Continue"
    open_and_wait(qtbot, window, scripts["fails"])
    with qtbot.waitSignal(window.error_shown, timeout=RUN_TIMEOUT):
        window.run()
    qtbot.waitUntil(lambda: window.state != "running", timeout=RUN_TIMEOUT)
    window.error_dialog.close()
    assert window.state == "step_failed" and "Step failed" in window.state_label.text()
    assert window.step_action.isEnabled()


def test_no_placeholder_settings_before_or_while_loading(qtbot, window, scripts) -> None:
    from gradscope.core.settings import RunSettings

    panel = window.settings_panel
    defaults = RunSettings()
    assert (panel.steps.value(), panel.image_size.value()) == (defaults.steps, 224)
    with qtbot.waitSignal(window.model_loaded, timeout=RUN_TIMEOUT):
        window.open_model(scripts["tiny"])
        assert not panel.isEnabled()  # loading: the model's settings are not known yet
    assert panel.isEnabled() and panel.steps.value() == 5


def test_hover_labels_stay_inside_the_plot(qtbot, window, scripts) -> None:
    import numpy as np
    from PySide6.QtCore import QPointF

    open_and_wait(qtbot, window, scripts["tiny"], steps=30)
    run_and_wait(qtbot, window, window.run)
    window._refresh()
    plot = window.plots.gradient_norm
    vb = plot.item.vb
    qtbot.wait(50)
    x, y = plot.curves["2"].getData()
    for index in (int(np.nanargmax(y)), len(x) - 1, 0):  # the highest point, the last, the first
        scene = vb.mapViewToScene(QPointF(float(x[index]), float(y[index])))
        plot._on_scene_mouse_moved(scene)
        assert plot.hover.isVisible(), index
        inside = vb.sceneBoundingRect().adjusted(-1, -1, 1, 1)
        assert inside.contains(plot.hover.sceneBoundingRect()), index


def test_at_1280x800_every_plot_fits_its_view(qtbot, window, scripts) -> None:
    # Long layer names once made the legend and the flow chart's name axis wider than their
    # plots: the right part of the plots (the flow chart's title and bars) was cut off.
    from pathlib import Path

    sample = Path(__file__).parents[2] / "sample_models" / "half_precision_attention_overflow.py"
    open_and_wait(qtbot, window, str(sample))
    run_and_wait(qtbot, window, window.run)
    window._refresh()
    qtbot.wait(50)
    for plot in (
        window.plots.gradient_norm,
        window.plots.loss,
        window.plots.heatmap,
        window.plots.flow,
    ):
        view = plot.widget
        scene_width = plot.item.sceneBoundingRect().width()
        assert scene_width <= view.viewport().width() + 1, (plot, scene_width)
    title = window.plots.flow.widget.plotItem.titleLabel
    assert title.text.startswith("Gradient flow at step")
    assert window.plots.flow.item.sceneBoundingRect().contains(title.sceneBoundingRect())


def test_after_a_rewind_trace_and_diagnosis_leave_the_abandoned_step(qtbot, window, scripts):
    open_and_wait(qtbot, window, scripts["nan"], trace=True, rewind_depth=5)
    run_and_wait(qtbot, window, window.run)
    debugger = window.debugger
    assert debugger.timeline.events and debugger.timeline.events[0].step == 2
    assert debugger.diagnosis.origin is not None
    with qtbot.waitSignal(debugger.rewound, timeout=RUN_TIMEOUT):
        assert debugger.rewind(1)
    qtbot.waitUntil(lambda: window.state != "running", timeout=RUN_TIMEOUT)
    assert debugger.timeline.events == [] and debugger.trace_events == []
    assert debugger.diagnosis.origin is None
    assert "No NaN/Inf" in debugger.diagnosis.summary.text()


def test_at_1280x800_events_keep_room_with_the_trace_open(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["nan"], trace=True)
    run_and_wait(qtbot, window, window.run)
    window.events_dock.raise_()
    window._refresh()
    qtbot.wait(50)
    assert window.debugger.trace_dock.isVisible()
    table = window.events_panel.table
    rows = table.viewport().height() / max(table.verticalHeader().defaultSectionSize(), 1)
    assert rows >= 4, rows  # it shrank to 1.5 rows
    # The diagnosis text scrolls instead of being cut.
    window.debugger.diagnosis_dock.raise_()
    qtbot.wait(50)
    pane = window.debugger.diagnosis
    assert pane.summary.text().startswith("step 2: first")
    assert pane.summary.parentWidget().parentWidget().inherits("QScrollArea")


def test_the_default_window_fits_the_screen(qapp, monkeypatch):
    """A 1280x800 laptop got a 1440x900 window running off its edges (seen under Xvfb)."""
    from PySide6.QtGui import QGuiApplication

    from gradscope.gui.app import DEFAULT_SIZE, _window_size

    monkeypatch.delenv("GRADSCOPE_WINDOW_SIZE", raising=False)
    room = QGuiApplication.primaryScreen().availableGeometry()
    width, height = _window_size()
    assert width <= room.width() and height <= room.height()
    assert width == min(DEFAULT_SIZE[0], room.width())
    assert height == min(DEFAULT_SIZE[1], room.height())
    monkeypatch.setenv("GRADSCOPE_WINDOW_SIZE", "1280x800")
    assert _window_size() == (1280, 800)
