"""Views that stay true to what is loaded (issue 15): no blank, stale or misleading views
after switching models, opening recordings or walking a trace."""

from __future__ import annotations

from gui_helpers import open_and_wait, run_and_wait


def _x_range(window) -> tuple[float, float]:
    return tuple(window.plots.gradient_norm.item.vb.viewRange()[0])


def test_a_new_model_starts_fitted_after_a_zoom(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.run)
    vb = window.plots.gradient_norm.item.vb
    # The user zooms far from the data (as a drag or the wheel does).
    vb.setXRange(400, 500, padding=0)
    vb.sigRangeChangedManually.emit(vb.state["mouseEnabled"])
    assert window.plots.follow_range is False
    open_and_wait(qtbot, window, scripts["nan"])
    run_and_wait(qtbot, window, window.run)
    window._refresh()
    low, high = _x_range(window)
    assert low <= 0 and high >= 2, (low, high)


def test_a_recording_opened_after_a_live_run_offers_no_live_actions(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"], rewind_depth=5)
    run_and_wait(qtbot, window, window.run)
    assert window.debugger.rewind_action.isEnabled()
    path = window.recordings.writer.path
    assert window.recordings.open_recording(path)
    assert window.state == "recording" and window.history.count == 5
    for action in (
        window.debugger.rewind_action,
        window.debugger.apply_action,
        window.run_action,
        window.step_action,
        window.pause_action,
        window.stop_action,
        window.restart_action,
    ):
        assert not action.isEnabled(), action.text()
    # Asked anyway (a stale menu, a script): nothing happens to the recording's view.
    assert not window.debugger.rewind(2)
    window.debugger.ask_rewind()
    assert window.state == "recording" and window.history.count == 5
    window.step()
    window.run()
    assert window.state == "recording" and window.history.count == 5


def _flow_bars(window) -> int:
    return len(window.plots.flow.bars.opts["y"])


def test_trace_mode_keeps_the_complete_step_in_the_flow_chart(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"], trace=True)
    run_and_wait(qtbot, window, window.run)
    window._refresh()
    assert window.debugger.timeline.events  # the step was traced
    assert _flow_bars(window) == 2
    assert window.plots.flow.widget.plotItem.titleLabel.text == "Gradient flow at step 4"
    # Paused before the optimizer step: the complete gradients, exactly when wanted.
    window.debugger.pause_before_apply_action.setChecked(True)
    paused = run_and_wait(qtbot, window, window.step)
    assert paused.reason == "before_apply"
    window._refresh()
    assert _flow_bars(window) == 2
    # Walking the trace shows the gradients as far as the walk got...
    timeline = window.debugger.timeline
    timeline.next()
    window._refresh()
    assert "event" in window.plots.flow.widget.plotItem.titleLabel.text
    assert _flow_bars(window) == 1
    # ...and the next step shows its complete flow again.
    run_and_wait(qtbot, window, window.debugger.apply_action.trigger)
    run_and_wait(qtbot, window, window.step)
    window._refresh()
    assert _flow_bars(window) == 2


def test_a_recording_shows_its_origin_and_its_own_settings_read_only(
    qtbot, window, scripts
) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    open_and_wait(qtbot, window, scripts["nan"])
    run_and_wait(qtbot, window, window.run)
    path = window.recordings.writer.path
    # Another model is open with other settings when the recording is opened.
    open_and_wait(qtbot, window, scripts["tiny"], lr=0.5)
    assert window.recordings.open_recording(path)
    origin = window.history.first_nonfinite
    assert origin is not None
    pane = window.debugger.diagnosis
    assert pane.origin is origin and "No NaN/Inf" not in pane.summary.text()
    panel = window.settings_panel
    assert panel.lr.value() == 0.1 and panel.steps.value() == 20  # the run's, not the model's
    assert panel.read_only
    assert panel.lr.isReadOnly() and panel.steps.isReadOnly()
    assert not panel.optimizer.isEnabled() and not panel.clip_enabled.isEnabled()
    open_and_wait(qtbot, window, scripts["tiny"])
    assert not panel.read_only and not panel.lr.isReadOnly() and panel.optimizer.isEnabled()
    assert window.debugger.diagnosis.origin is None


def test_a_failed_open_leaves_the_previous_model_loaded_and_usable(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.step)
    title, state_before = window.windowTitle(), window.state
    runner = window.run_thread.worker.runner
    with qtbot.waitSignal(window.error_shown, timeout=30_000):
        window.open_model(scripts["broken"])
    window.error_dialog.close()
    assert window.windowTitle() == title and "tiny_mlp" in title
    assert window.source == scripts["tiny"]
    assert "tiny_mlp" in window.model_label.text()
    assert window.run_thread.worker.runner is runner  # not closed
    assert window.state == state_before and window.history.count == 1
    assert window.step_action.isEnabled() and window.run_action.isEnabled()
    run_and_wait(qtbot, window, window.step)
    assert window.history.count == 2
    # Run continues the loaded model, it does not re-open the broken script.
    paused = run_and_wait(qtbot, window, window.run)
    assert paused.reason == "completed" and window.history.count == 5
