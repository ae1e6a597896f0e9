"""File > Open recording on damaged and crafted recordings (the corruptions of
tests/test_recording_fuzz.py): each either shows in the window or gives the error dialog,
and the app keeps running, showing what it showed before."""

from __future__ import annotations

from pathlib import Path

from recording_corruptions import corrupted_copies, make_recording

from gradscope.cli import main


def test_open_recording_on_every_corruption_keeps_the_app_running(
    qtbot, window, tmp_path, capsys
) -> None:
    original = make_recording(tmp_path)
    assert window.recordings.open_recording(original)
    shown = window.history
    assert shown.count == 40
    opened = refused = 0
    for name, path in corrupted_copies(original, tmp_path / "cases"):
        readable = main(["report", str(path)]) == 0
        capsys.readouterr()
        if window.recordings.open_recording(path):
            assert readable, f"{name!r}: the app showed what report refuses"
            opened += 1
            shown = window.history
            assert window.state == "recording"
        else:
            assert not readable, f"{name!r}: report read what the app refuses"
            refused += 1
            # the dialog says why; the window shows what it showed before
            dialog = window.error_dialog
            assert dialog is not None and dialog.isVisible(), name
            assert str(path) in dialog.message, name
            dialog.close()
            window.error_dialog = None
            assert window.history is shown, name
        Path(path).unlink()
    assert opened and refused > 100
    assert window.isVisible() and window.state == "recording"
