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
    for action in (window.debugger.rewind_action, window.debugger.apply_action,
                   window.run_action, window.step_action, window.pause_action,
                   window.stop_action, window.restart_action):
        assert not action.isEnabled(), action.text()
    # Asked anyway (a stale menu, a script): nothing happens to the recording's view.
    assert not window.debugger.rewind(2)
    window.debugger.ask_rewind()
    assert window.state == "recording" and window.history.count == 5
    window.step()
    window.run()
    assert window.state == "recording" and window.history.count == 5
