"""Recordings written by an older GradScope still open and report exactly as they did.

``tests/data/v2_recording.gsrec`` was written by GradScope before statistics were stored by
name (recording format 2), with its ``report --json`` and ``--csv`` output beside it, made by
that same GradScope. The script that wrote it (kept here so it can be made again with an old
checkout): a Linear(4,6)-Tanh-Linear(6,3)-Tanh-Linear(3,1) MLP (seed 0), SGD lr 0.1,
``gradscope.watch(model, record=..., detail_every=2, update_ratio=True)``, 8 steps, a NaN in
the batch at step 5 (the weights cleaned with ``nan_to_num_`` after it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gradscope.cli import main
from gradscope.core.recording import RecordingReader

DATA = Path(__file__).parent / "data"


@pytest.fixture
def old(tmp_path) -> Path:
    """A copy: a reader of a WAL-mode file makes its -shm and -wal beside it."""
    copy = tmp_path / "v2_recording.gsrec"
    shutil.copyfile(DATA / "v2_recording.gsrec", copy)
    return copy


def test_format_2_recording_opens_with_its_steps(old):
    with RecordingReader(old) as reader:
        assert reader.format_version == 2
        _, history = reader.load()
    assert history.count == 8
    assert history.layer_names == ["0", "2", "4"]
    assert history.first_nonfinite is not None and history.first_nonfinite.step == 5


def test_format_2_recording_reports_json_and_csv_as_before(old, tmp_path):
    report, table = tmp_path / "report.json", tmp_path / "steps.csv"
    assert main(["report", str(old), "--json", str(report), "--csv", str(table)]) == 0
    expected = json.loads((DATA / "v2_recording.report.json").read_text(encoding="utf-8"))
    # Keys the report gained since the fixture was made, with what an older recording gives:
    # "warnings" (issue #37) is null where the run did not look for early warnings.
    expected["warnings"] = None
    assert json.loads(report.read_text(encoding="utf-8")) == expected
    assert table.read_text(encoding="utf-8") == (DATA / "v2_recording.csv").read_text(
        encoding="utf-8"
    )
