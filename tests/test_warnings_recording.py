"""Early warnings (#37) in recordings: the writer stores each step's warnings, the reader puts
them back in ``RunHistory.warnings`` (each also an Event "warning"), ``gradscope report``
lists them and fills the JSON's top-level ``"warnings"``; a damaged warning row is one
clear error, and a file written before the table opens as before."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import gradscope
from gradscope.cli import main
from gradscope.core.errors import GradScopeError
from gradscope.core.recording import RecordingReader
from tests.models.drift_cases import CLASSES, FEATURES, ResidualClassifier


def _drifting_run(path: Path, *, early_warnings: bool = True, steps: int = 40) -> list:
    """The float16 residual stream of the drift cases (warns at blocks.3 within 40 steps),
    recorded: the watch's warnings."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    prototypes = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(4))
    model = ResidualClassifier(torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.2)
    with gradscope.watch(
        model, record=path, early_warnings=early_warnings, commit_seconds=0.05
    ) as watch:
        for _ in range(steps):
            labels = torch.randint(0, CLASSES, (64,))
            inputs = prototypes[labels] + 2 * torch.randn(64, FEATURES)
            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            watch.collect(loss)
            optimizer.step()
        given = list(watch.early_warnings.warnings) if early_warnings else []
    return given


@pytest.fixture(scope="module")
def warned(tmp_path_factory) -> tuple[Path, list]:
    path = tmp_path_factory.mktemp("warned") / "run.gsrec"
    given = _drifting_run(path)
    assert given, "the drifting case should warn"
    return path, given


def test_the_recording_gives_back_the_warnings_and_their_events(warned):
    path, given = warned
    with RecordingReader(path) as reader:
        _, history = reader.load()
        assert reader.looked_for_warnings
    assert [w.to_json() for w in history.warnings] == [w.to_json() for w in given]
    events = [(e.step, e.layer, e.message) for e in history.events if e.kind == "warning"]
    assert events == [(w.step, w.module, w.describe()) for w in given]
    # a decimated load and a window of the run keep them too
    with RecordingReader(path) as reader:
        _, decimated = reader.load(max_rows=5)
        window = reader.read_window(given[0].step, given[0].step + 1)
    assert [w.to_json() for w in decimated.warnings] == [w.to_json() for w in given]
    assert [w.to_json() for w in window.warnings] == [
        w.to_json() for w in given if w.step == given[0].step
    ]


def test_report_lists_the_warnings_and_fills_the_json(warned, tmp_path, capsys):
    path, given = warned
    report = tmp_path / "report.json"
    capsys.readouterr()
    assert main(["report", str(path), "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert f"early warnings: {len(given)}" in out
    assert given[0].describe() in out
    assert json.loads(report.read_text())["warnings"] == [w.to_json() for w in given]


def test_a_run_that_did_not_look_for_them_reports_null(tmp_path, capsys):
    path = tmp_path / "plain.gsrec"
    _drifting_run(path, early_warnings=False, steps=3)
    report = tmp_path / "report.json"
    assert main(["report", str(path), "--json", str(report)]) == 0
    assert json.loads(report.read_text())["warnings"] is None
    assert "early warnings" not in capsys.readouterr().out


def test_a_file_without_the_warnings_table_opens_as_before(warned, tmp_path, capsys):
    path = tmp_path / "older.gsrec"
    path.write_bytes(warned[0].read_bytes())
    with sqlite3.connect(path) as connection:
        connection.execute("DROP TABLE warnings")
    connection.close()
    with RecordingReader(path) as reader:
        _, history = reader.load()
        assert not reader.looked_for_warnings
    assert history.warnings == []
    assert any(e.kind == "warning" for e in history.events)  # the events stay
    report = tmp_path / "report.json"
    assert main(["report", str(path), "--json", str(report)]) == 0
    assert json.loads(report.read_text())["warnings"] is None


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ("{not json", "an early warning is not valid JSON"),
        ("[1, 2]", "an early warning is a JSON list, not an object"),
        ('{"step": 3}', "an early warning lacks module, kind"),
        (None, "an early warning is NULL, not text"),
    ],
)
def test_a_damaged_warning_row_is_one_clear_error(warned, tmp_path, capsys, data, said):
    path = tmp_path / "damaged.gsrec"
    path.write_bytes(warned[0].read_bytes())
    with sqlite3.connect(path) as connection:
        if data is None:  # NOT NULL in the schema: a crafted file drops the constraint
            connection.execute("ALTER TABLE warnings RENAME TO old")
            connection.execute("CREATE TABLE warnings(id INTEGER PRIMARY KEY, row, data)")
            connection.execute("INSERT INTO warnings SELECT * FROM old")
            connection.execute("DROP TABLE old")
            connection.execute("UPDATE warnings SET data = NULL")
        else:
            connection.execute("UPDATE warnings SET data = ?", (data,))
    connection.close()
    with pytest.raises(GradScopeError, match="is damaged") as raised:
        with RecordingReader(path) as reader:
            reader.load()
    assert said in str(raised.value)
    capsys.readouterr()
    assert main(["report", str(path)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0]


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("step", "3", "an early warning's step is text, not an integer"),
        ("value", None, "an early warning's value is null, not a number"),
        ("steps_left", -4, "an early warning's steps_left is -4, below 0"),
        ("module", 7, "an early warning's module is an integer, not text"),
    ],
)
def test_a_warning_field_outside_its_domain_says_which(warned, tmp_path, field, value, said):
    path = tmp_path / "crafted.gsrec"
    path.write_bytes(warned[0].read_bytes())
    with sqlite3.connect(path) as connection:
        data = json.loads(connection.execute("SELECT data FROM warnings").fetchone()[0])
        data[field] = value
        connection.execute("UPDATE warnings SET data = ?", (json.dumps(data),))
    connection.close()
    with pytest.raises(GradScopeError, match="is damaged") as raised:
        with RecordingReader(path) as reader:
            reader.load()
    assert said in str(raised.value)


def test_a_follower_drops_the_abandoned_branchs_warnings_and_reads_the_new_ones(tmp_path):
    from torch import nn

    from gradscope.core.facts import EarlyWarning
    from gradscope.core.module_tree import build_module_tree
    from gradscope.core.recording import RecordingWriter
    from gradscope.core.watch import GradientWatch

    def warning(step: int, module: str) -> EarlyWarning:
        return EarlyWarning(step, module, "drifting", "output max |x|", 40.0, 65504.0, "5 -> 40")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    watch = GradientWatch(model)
    path = tmp_path / "rewound.gsrec"
    writer = RecordingWriter(path, build_module_tree(model))

    def steps(count: int, warned: dict[int, EarlyWarning]) -> None:
        for _ in range(count):
            model.zero_grad()
            stats = watch.collect(model(torch.randn(2, 3)).sum())
            stats.warnings = [warned[stats.step]] if stats.step in warned else []
            writer.append(stats, watch.layers)
        writer.flush()

    first, abandoned, new = warning(2, "0"), warning(4, "2"), warning(4, "0")
    steps(6, {2: first, 4: abandoned})
    follower = RecordingReader(path)
    _, followed = follower.load()
    assert followed.warnings == [first, abandoned]
    writer.rewind_to(3)
    watch._step = 3  # as StepRunner.rewind sets the watch's step
    steps(3, {4: new})
    assert follower.read_new_steps(followed) == 3
    writer.close()
    follower.close()
    assert followed.warnings == [first, new]
    assert [e.layer for e in followed.events if e.kind == "warning"] == ["0", "0"]
    with RecordingReader(path) as reader:
        assert reader.load()[1].warnings == [first, new]


def test_report_of_a_rank_set_gives_rank_0s_warnings(warned, tmp_path, capsys):
    path, given = warned
    rank_file = tmp_path / "run.rank0.gsrec"
    rank_file.write_bytes(path.read_bytes())
    report = tmp_path / "report.json"
    capsys.readouterr()
    assert main(["report", str(tmp_path / "run.gsrec"), "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "rank 0's recording of 1" in out  # read as a set of rank files
    assert f"early warnings: {len(given)}" in out
    assert json.loads(report.read_text())["warnings"] == [w.to_json() for w in given]


@pytest.mark.parametrize("looked", [True, False])
def test_the_apps_recording_says_by_its_settings_whether_it_looked(tmp_path, capsys, looked):
    """The app writes its recording itself (no watch sink): its run settings say it."""
    from torch import nn

    from gradscope.core.module_tree import build_module_tree
    from gradscope.core.recording import RecordingWriter
    from gradscope.core.settings import RunSettings
    from gradscope.core.watch import GradientWatch

    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    watch = GradientWatch(model, early_warnings=looked)
    path = tmp_path / "app.gsrec"
    settings = RunSettings(early_warnings=looked).to_dict()
    writer = RecordingWriter(path, build_module_tree(model), settings, info={"source": "x.py"})
    for _ in range(3):
        model.zero_grad()
        writer.append(watch.collect(model(torch.randn(2, 3)).sum()), watch.layers)
    writer.close()
    watch.close()
    report = tmp_path / "report.json"
    capsys.readouterr()
    assert main(["report", str(path), "--json", str(report)]) == 0
    assert json.loads(report.read_text())["warnings"] == ([] if looked else None)
    assert ("early warnings: none" in capsys.readouterr().out) == looked
