"""Walking through a traced step in the window, pausing before the optimizer step, and
rewinding: real runs of tiny models on the run thread."""

from __future__ import annotations

from gui_helpers import RUN_TIMEOUT, open_and_wait, run_and_wait
from PySide6.QtCore import Qt

from gradscope.core.trace import BACKWARD


def current_tree_name(window) -> str | None:
    from gradscope.gui.module_tree_model import NAME_ROLE

    return window.tree_view.currentIndex().data(NAME_ROLE)


def test_moving_the_timeline_selects_the_module_in_the_tree(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"], trace=True)
    run_and_wait(qtbot, window, window.step)
    timeline = window.debugger.timeline
    assert window.debugger.trace_dock.isVisible()
    events = timeline.events
    assert [e.module for e in events if e.phase == "forward"] == ["0", "1", "2", ""]
    # the cursor starts at the first backward event; walk the whole backward pass
    visited = []
    while True:
        event = events[timeline.index]
        if event.phase == BACKWARD and event.module:
            visited.append(event.module)
            assert current_tree_name(window) == event.module
        if timeline.index == len(events) - 1:
            break
        qtbot.keyClick(timeline.slider, Qt.Key.Key_Right)
    assert visited == ["2", "1", "0"]
    # the gradient-flow chart filled in from the output layer back to the input
    assert set(window.debugger.flow_override) == {"0", "2"}
    qtbot.keyClick(timeline.slider, Qt.Key.Key_Home)
    assert current_tree_name(window) == "0"
    assert window.debugger.flow_override is None


def test_pause_before_the_optimizer_step_then_apply(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    window.debugger.pause_before_apply_action.setChecked(True)
    paused = run_and_wait(qtbot, window, window.step)
    assert paused.reason == "before_apply"
    assert window.state == "before_apply"
    runner = window.run_thread.worker.runner
    assert runner.pending_step is not None and runner.step_index == 0
    weights = runner.model[0].weight.detach().clone()
    assert window.debugger.apply_action.isEnabled()
    run_and_wait(qtbot, window, window.debugger.apply_action.trigger)
    assert runner.pending_step is None and runner.step_index == 1
    assert not runner.model[0].weight.detach().equal(weights)
    assert window.history.count == 1


def test_rewind_replaces_the_branch_and_reproduces_losses(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"], rewind_depth=5)
    run_and_wait(qtbot, window, window.run)
    first = list(window.history.losses)
    assert len(first) == 5
    assert window.debugger.rewind_steps == [0, 1, 2, 3, 4]
    assert "rewind: 5 step(s)" in window.debugger.memory_label.text()
    with qtbot.waitSignal(window.debugger.rewound, timeout=RUN_TIMEOUT):
        assert window.debugger.rewind(2)
    qtbot.waitUntil(lambda: window.state != "running", timeout=RUN_TIMEOUT)
    assert list(window.history.steps) == [0, 1]
    run_and_wait(qtbot, window, window.run)
    assert list(window.history.steps) == [0, 1, 2, 3, 4]
    assert list(window.history.losses) == first


def test_app_defaults_sit_under_the_scripts_config(qtbot, window, scripts, tmp_path) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    settings = window.run_thread.worker.runner.settings
    assert settings.update_ratio is True and settings.rewind_depth == 5
    script = tmp_path / "configured.py"
    script.write_text(open(scripts["tiny"]).read().replace(
        '"device": "cpu"}', '"device": "cpu", "rewind_depth": 2}'))
    open_and_wait(qtbot, window, str(script))
    assert window.run_thread.worker.runner.settings.rewind_depth == 2
