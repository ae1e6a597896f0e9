"""The app's side of issue 26: File > Open recording on crafted files shows the error
dialog (no exception, no word of a script to fix); start-up without arguments runs no
script the user did not ask for."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QLabel

from tests.test_reliability import CRAFTED, crafted, record_real_run


@pytest.fixture(scope="module")
def real_recording(tmp_path_factory):
    return record_real_run(tmp_path_factory.mktemp("real") / "real.gsrec")


def test_open_recording_on_each_crafted_file_shows_one_message(window, real_recording, tmp_path):
    for name in sorted(CRAFTED):
        path = crafted(real_recording, tmp_path, name)
        assert window.recordings.open_recording(path) is False, name
        dialog = window.error_dialog
        shown = [label.text() for label in dialog.findChildren(QLabel)]
        assert CRAFTED[name][1] in dialog.message, (name, dialog.message)
        assert dialog.details == [], name
        # No script and no Restart in a window that shows a recording.
        assert not any("Restart" in text or "script" in text for text in shown), shown
        dialog.close()
    assert window.recordings.open_recording(real_recording) is True
