"""Recordings in the window: the app records its own runs, opens recordings without a
model, follows one that another process is still writing, and survives bad files."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from gradscope.core.recording import RecordingReader
from gradscope.gui.recordings import runs_folder

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30_000

WRITER = textwrap.dedent('''
    import sys, time
    sys.path.insert(0, {repo!r})
    import torch, gradscope
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gradscope.watch(model, record={path!r}, commit_seconds=0.2) as watch:
        for step in range({steps}):
            loss = nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1))
            loss.backward()
            watch.collect(loss)
            opt.step()
            opt.zero_grad()
            print(step, flush=True)
            time.sleep({pause})
''')


def _write(tmp_path: Path, steps: int, pause: float) -> tuple[Path, subprocess.Popen]:
    path = tmp_path / "live.gsrec"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(repo=str(REPO), path=str(path), steps=steps, pause=pause))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    return path, child


def test_app_records_its_own_runs(qtbot, window, scripts) -> None:
    before = set(runs_folder().glob("*.gsrec")) if runs_folder().exists() else set()
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.open_model(scripts["tiny"])
    # Opening a model (every launch does) writes nothing: the recording starts with a step.
    assert window.recordings.writer is None
    assert (set(runs_folder().glob("*.gsrec")) if runs_folder().exists() else set()) == before
    with qtbot.waitSignal(window.run_paused, timeout=TIMEOUT):
        window.run()
    writer = window.recordings.writer
    assert writer is not None and writer.path.parent == runs_folder()
    path = writer.path
    window.recordings.close_writer()
    with RecordingReader(path) as reader:
        _, history = reader.load()
    assert list(history.losses) == list(window.history.losses)
    assert history.layer_names == window.history.layer_names
    assert path in window.recordings.recent_runs()


def test_follow_mode_picks_up_new_steps(qtbot, window, tmp_path) -> None:
    path, child = _write(tmp_path, steps=400, pause=0.02)
    try:
        assert child.stdout is not None
        child.stdout.readline()  # the first step is collected
        qtbot.waitUntil(lambda: RecordingReader(path).row_count() > 0, timeout=TIMEOUT)
        assert window.recordings.open_recording(path)
        assert window.state == "recording"
        assert window.recordings.follow_action.isChecked()
        first = window.history.count
        qtbot.waitUntil(lambda: window.history.count > first + 5, timeout=TIMEOUT)
        assert not window.run_action.isEnabled()
        assert window.plots.gradient_norm.curves  # curves drawn from the recording
    finally:
        child.kill()
        child.wait()


def test_bad_recording_shows_an_error_and_the_app_survives(qtbot, window, tmp_path) -> None:
    bad = tmp_path / "notes.gsrec"
    bad.write_text("this is not a recording")
    assert not window.recordings.open_recording(bad)
    assert window.error_dialog is not None and window.error_dialog.isVisible()
    window.error_dialog.close()
    assert window.state == "empty"


def test_statistics_csv_export_from_the_app(qtbot, window, scripts, tmp_path) -> None:
    import csv

    import numpy as np

    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.open_model(scripts["tiny"])
    with qtbot.waitSignal(window.run_paused, timeout=TIMEOUT):
        window.run()
    everything = tmp_path / "all.csv"
    assert window.export_statistics_csv(str(everything)) == 10  # 5 steps x 2 layers
    rows = list(csv.DictReader(everything.open()))
    assert {r["layer"] for r in rows} == {"0", "2"}
    first = next(r for r in rows if r["layer"] == "0" and r["step"] == "0")
    # float32 values, written with the 9 digits that round-trip them
    assert np.float32(first["grad_norm"]) == window.history.series("grad_norm", "0")[0]
    one = tmp_path / "one.csv"
    assert window.export_statistics_csv(str(one), "2") == 5


def test_a_recording_after_a_rewind_tells_both_branches_and_the_settings(
    qtbot, window, scripts, tmp_path
) -> None:
    import json

    from gradscope.cli import main as cli_main

    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.open_model(scripts["nan"], {"rewind_depth": 5})
    with qtbot.waitSignal(window.run_paused, timeout=TIMEOUT):
        window.run()
    assert window.state == "halted" and window.history.first_nonfinite.step == 2
    path = window.recordings.writer.path
    # A what-if: a smaller learning rate, from before the step that went wrong.
    panel = window.settings_panel
    panel.lr.setText("0.001")
    panel.lr.editingFinished.emit()
    with qtbot.waitSignal(window.debugger.rewound, timeout=TIMEOUT):
        assert window.debugger.rewind(0)
    qtbot.waitUntil(lambda: window.state != "running", timeout=TIMEOUT)
    for _ in range(3):
        with qtbot.waitSignal(window.run_paused, timeout=TIMEOUT):
            window.step()
    assert window.history.first_nonfinite is None  # the new branch is healthy
    kinds = [event.kind for event in window.history.events]
    assert "rewind" in kinds and "settings" in kinds  # the live Events list tells it too
    window.recordings.close_writer()

    with RecordingReader(path) as reader:
        _, history = reader.load()
    assert list(history.steps) == [0, 1, 2]
    run_events = {event.kind: event for event in history.events
                  if event.kind in ("settings", "rewind")}
    rewind = run_events["rewind"]
    assert rewind.step == 0 and "steps 0-2" in rewind.message
    assert "its first NaN/Inf" in rewind.message and "step 2" in rewind.message
    settings = run_events["settings"]
    assert settings.step == 0 and "lr 0.1 -> 0.001" in settings.message
    assert reader.settings["lr"] == 0.1  # the start settings stay the start's

    # `gradscope report` states both branches and the change, not "no NaN at lr 0.1".
    report = tmp_path / "report.json"
    cli_main(["report", str(path), "--json", str(report)])
    data = json.loads(report.read_text())
    assert [e["kind"] for e in data["run_events"]] == ["settings", "rewind"] or [
        e["kind"] for e in data["run_events"]] == ["rewind", "settings"]
    assert data["first_nonfinite"] is None

    # Opened in the app, the Events list shows them.
    assert window.recordings.open_recording(path)
    shown = [window.events_panel.table.item(r, 1).text()
             for r in range(window.events_panel.table.rowCount())]
    assert "rewound" in shown and "settings changed" in shown
