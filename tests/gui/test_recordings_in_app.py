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
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.open_model(scripts["tiny"])
    writer = window.recordings.writer
    assert writer is not None and writer.path.parent == runs_folder()
    with qtbot.waitSignal(window.run_paused, timeout=TIMEOUT):
        window.run()
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
