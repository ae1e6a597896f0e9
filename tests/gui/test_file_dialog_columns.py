"""Qt's own file dialogs show their Size and Type columns whole (issue 27: they read
"156...KiB" and "SQL...ase")."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QFileDialog, QTreeView

from gradscope.gui import file_dialog_columns


def _dialog(qtbot, folder) -> tuple[QFileDialog, QTreeView]:
    dialog = QFileDialog(None, "Open recording", str(folder), "GradScope recordings (*.gsrec)")
    dialog.setOption(QFileDialog.Option.DontUseNativeDialog)
    dialog.setViewMode(QFileDialog.ViewMode.Detail)
    qtbot.addWidget(dialog)
    view = dialog.findChild(QTreeView)
    assert view is not None
    return dialog, view


def test_file_dialog_columns_fit_what_they_show(qtbot, tmp_path) -> None:
    (tmp_path / "a_recording_with_a_long_name_from_yesterday.gsrec").write_bytes(
        b"SQLite format 3\x00" + b"\x00" * 160_000
    )
    (tmp_path / "empty").mkdir()
    file_dialog_columns.install(QApplication.instance())
    dialog, view = _dialog(qtbot, tmp_path / "empty")
    dialog.show()
    qtbot.wait(100)
    dialog.setDirectory(str(tmp_path))  # a folder opened later: sized to its files too
    qtbot.waitUntil(lambda: view.model().rowCount(view.rootIndex()) == 2, timeout=10_000)
    qtbot.wait(50)
    header = view.header()
    for column in (1, 2, 3):  # Size, Type, Date Modified
        assert header.sectionSize(column) >= view.sizeHintForColumn(column), column
    room = dialog.screen().availableGeometry().width()
    assert dialog.width() >= min(860, int(room * 0.9))
    dialog.close()
