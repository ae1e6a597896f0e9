"""Damaged and crafted recordings never crash the reader and never fail in silence: a real
recording, about 200 deterministic corruptions of it (bit flips, truncations, SQL edits),
and for each `gradscope report` and `gradscope open` either read it or exit 2 with exactly
one line on stderr. Values outside their domain are refused; `open` checks before any
window what the window reads. Run in-process through the CLI's main(argv) (the app's start
is the one thing replaced: tests/gui/test_recording_fuzz_in_app.py opens them in the app)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from recording_corruptions import MAY_OPEN, corrupted_copies, corruptions, make_recording
from torch import nn

import gradscope
import gradscope.cli as cli
from gradscope.core.facts import STATUS_NAMES
from gradscope.core.recording import RecordingReader


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    return make_recording(tmp_path_factory.mktemp("original"))


@pytest.fixture
def launched(monkeypatch) -> list[str]:
    """The recordings `gradscope open` handed to the app (whose start is not run here)."""
    calls: list[str] = []

    def launcher():
        def launch(model, overrides, screenshot=None, recording=None, compare=None, **more):
            calls.append(recording)
            return 0

        return launch

    monkeypatch.setattr(cli.app, "app_launcher", launcher)
    return calls


def _run(argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = cli.main(argv)
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _assert_contract(command: str, name: str, code: int, lines: list[str]) -> None:
    assert code in (0, 2), f"{command} {name!r}: exit {code}: {lines[:3]}"
    if code == 2:
        assert len(lines) == 1, f"{command} {name!r}: exit 2 with {lines}"
        assert lines[0].startswith("gradscope: error: "), f"{command} {name!r}: {lines}"
        assert "Traceback" not in lines[0]


def _assert_sound(path: Path) -> None:
    """A recording that opens holds only what the format allows."""
    with RecordingReader(path) as reader:
        _, history = reader.load()
    statuses = history.status_matrix()
    assert ((statuses < len(STATUS_NAMES)) | (statuses == 255)).all()
    assert all(params >= 0 for params in history.layer_params)
    for layer in history.layer_names:
        history.worst(layer), history.last_status(layer), history.worst_first_seen(layer)


def test_every_corruption_is_read_or_refused_in_one_line(recording, tmp_path, capsys, launched):
    refused: list[str] = []
    count = 0
    for name, path in corrupted_copies(recording, tmp_path / "cases"):
        count += 1
        report_code, report_lines = _run(["report", str(path)], capsys)
        _assert_contract("report", name, report_code, report_lines)
        launched.clear()
        open_code, open_lines = _run(["open", str(path)], capsys)
        _assert_contract("open", name, open_code, open_lines)
        # the check before the window reads what the window reads: both agree on a file
        assert (open_code == 2) == (report_code == 2), (name, report_lines, open_lines)
        assert launched == ([] if open_code == 2 else [str(path)])
        if report_code == 2:
            refused.append(name)
            # nothing left beside a file only read
            assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
        else:
            _assert_sound(path)
        path.unlink()
    assert count >= 190
    # every value put outside its domain is refused, not read
    crafted = [name for name, _ in corruptions() if not name.startswith(("bit flip", "trunc"))]
    wrongly_read = [name for name in crafted if name not in refused and name not in MAY_OPEN]
    assert not wrongly_read
    assert len(refused) > len(crafted) - len(MAY_OPEN) - 1


@pytest.mark.parametrize(
    "name",
    [
        "layer params negative",
        "grad norm short blob",
        "flags 255",
        "status code 7",
        "status code 200",
        "rewind row of text",
        "writer lock heartbeat text",
    ],
)
def test_values_outside_their_domain_say_which_value(recording, tmp_path, capsys, name):
    corrupt = dict(corruptions())[name]
    path = tmp_path / "crafted.gsrec"
    shutil.copyfile(recording, path)
    corrupt(path)
    code, lines = _run(["report", str(path)], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert f"{path} is damaged" in lines[0]


def _long_recording(path: Path, steps: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    with gradscope.watch(model, record=path, detail_every=50) as watch:
        for _ in range(steps):
            model.zero_grad()
            model(torch.randn(2, 3)).sum().backward()
            watch.collect()


def test_open_checks_the_rows_the_window_reads(tmp_path, capsys, launched):
    """A damaged row that a coarse check skips (row 150 of 200: the 64-row check read
    every fourth) but the window reads (it reads up to 5,000 rows whole): `open` says so in
    one line and starts no window."""
    path = tmp_path / "long.gsrec"
    _long_recording(path, 200)
    connection = sqlite3.connect(str(path), isolation_level=None)
    connection.execute("UPDATE grad_norm SET data = x'0000' WHERE row = 150")
    connection.close()
    code, lines = _run(["open", str(path)], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert "damaged" in lines[0]
    assert launched == []


def test_report_leaves_nothing_beside_a_recording_it_read(recording, tmp_path, capsys):
    path = tmp_path / "read.gsrec"
    shutil.copyfile(recording, path)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "out"
    out.mkdir()
    code, _ = _run(["report", str(path), "--json", str(out / "r.json")], capsys)
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "out"])
    with RecordingReader(path) as reader:
        _, history = reader.load()
    assert history.count == 40 and np.isfinite(history.losses[:5]).all()


def test_open_checks_every_rank_of_a_set(recording, tmp_path, capsys, launched):
    """The window reads every rank's file of a distributed run's set: a damaged rank 1 is
    said before any window when rank 0's is opened."""
    for rank in (0, 1):
        shutil.copyfile(recording, tmp_path / f"run.rank{rank}.gsrec")
    dict(corruptions())["status code 7"](tmp_path / "run.rank1.gsrec")
    code, lines = _run(["open", str(tmp_path / "run.rank0.gsrec")], capsys)
    assert code == 2, lines
    assert lines[-1].startswith("gradscope: error: ") and "run.rank1.gsrec is damaged" in lines[-1]
    assert launched == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rank0.gsrec", "run.rank1.gsrec"]
