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


def test_start_without_arguments_offers_the_last_script_and_runs_it_only_when_asked(
    window, preferences, tmp_path, qtbot
):
    from gradscope.gui.app import default_model, offer_reopen, script_to_offer

    marker = tmp_path / "imported"
    script = tmp_path / "mine.py"
    script.write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "import torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Linear(4, 1)\n"
        "def make_batch(batch_size, device):\n"
        "    return torch.randn(batch_size, 4), torch.randn(batch_size, 1)\n"
    )
    preferences.setValue("model/last", str(script))
    assert default_model(preferences) is None  # nothing is opened (nor imported) at start
    assert script_to_offer(preferences) == str(script)
    action = offer_reopen(window, str(script), {})
    assert window.file_menu.actions()[0] is action and action.text() == "Reopen mine.py"
    assert "Reopen mine.py" in window.statusBar().currentMessage()
    qtbot.wait(200)
    assert not marker.exists()
    with qtbot.waitSignal(window.model_loaded, timeout=60_000):
        action.trigger()  # the user asks
    assert marker.exists()
    # A built-in name and GradScope's own samples are reopened as before.
    preferences.setValue("model/last", "resnet18")
    assert default_model(preferences) == "resnet18" and script_to_offer(preferences) is None
