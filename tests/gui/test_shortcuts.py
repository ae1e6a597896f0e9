"""Application shortcuts work wherever the focus is (issue 15, defect 6): a focused text field
does not swallow Ctrl+Z or Ctrl+E, the trace keys work without clicking the timeline, and
Help > Keyboard shortcuts lists them all."""

from __future__ import annotations

from gui_helpers import RUN_TIMEOUT, open_and_wait, run_and_wait
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog

CTRL = Qt.KeyboardModifier.ControlModifier


def test_ctrl_z_in_a_settings_field_rewinds_and_keeps_the_typed_value(
    qtbot, window, scripts, monkeypatch
) -> None:
    open_and_wait(qtbot, window, scripts["tiny"], rewind_depth=5)
    run_and_wait(qtbot, window, window.run)
    asked = []

    def get_item(parent, title, label, items, current, editable):
        asked.append(list(items))
        return "before step 2", True

    monkeypatch.setattr(QInputDialog, "getItem", staticmethod(get_item))
    window.settings_dock.raise_()
    field = window.settings_panel.lr
    field.setFocus()
    qtbot.waitUntil(field.hasFocus)
    field.selectAll()
    qtbot.keyClicks(field, "0.5")
    with qtbot.waitSignal(window.debugger.rewound, timeout=RUN_TIMEOUT):
        qtbot.keyClick(field, Qt.Key.Key_Z, CTRL)
    assert asked, "Ctrl+Z did not reach Rewind"
    assert field.text() == "0.5"  # not undone
    qtbot.waitUntil(lambda: window.state != "running", timeout=RUN_TIMEOUT)
    assert list(window.history.steps) == [0, 1]


def test_ctrl_e_in_a_text_field_exports_the_plots(
    qtbot, window, scripts, tmp_path, monkeypatch
) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.run)
    target = tmp_path / "plots.png"
    monkeypatch.setattr(
        QFileDialog, "getSaveFileName", staticmethod(lambda *args, **kwargs: (str(target), ""))
    )
    window.filter_edit.setFocus()
    qtbot.waitUntil(window.filter_edit.hasFocus)
    qtbot.keyClick(window.filter_edit, Qt.Key.Key_E, CTRL)
    assert target.exists() and target.stat().st_size > 1000
    # Typing still types.
    qtbot.keyClicks(window.filter_edit, "fe")
    assert window.filter_edit.text() == "fe"


def test_trace_keys_work_without_clicking_the_timeline(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"], trace=True)
    run_and_wait(qtbot, window, window.step)
    timeline = window.debugger.timeline
    start = timeline.index
    window.plots.setFocus()  # e.g. after looking at a plot
    qtbot.keyClick(window.plots, Qt.Key.Key_Right)
    assert timeline.index == start + 1
    qtbot.keyClick(window.plots, Qt.Key.Key_Left)
    assert timeline.index == start
    # In the tree, Left and Right still fold and unfold rows: the trace stays.
    window.tree_view.setFocus()
    qtbot.keyClick(window.tree_view, Qt.Key.Key_Right)
    assert timeline.index == start
    # In a text field, F is a letter.
    window.filter_edit.setFocus()
    qtbot.keyClick(window.filter_edit, Qt.Key.Key_F)
    assert window.filter_edit.text() == "f" and timeline.index == start


def test_help_lists_every_shortcut(qtbot, window) -> None:
    dialog = window.show_shortcuts()
    rows = dict(dialog.rows())
    assert rows["Rewind"] == "Ctrl+Z"
    assert rows["Export plots as PNG"] == "Ctrl+E"
    assert rows["Next trace event"] == "Right"
    assert rows["Keyboard shortcuts"] == "F1"
    assert {"Run", "Pause", "Step", "Stop", "Follow latest step"} <= set(rows)
    dialog.close()
