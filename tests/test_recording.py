"""Recordings: what a training loop records reads back exactly; a killed writer leaves a
readable file; one writer per file; bad files give one clear error; follow mode picks up
new steps; ``gradscope report`` speaks ``gradscope run``'s JSON schema; CSV export."""

from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.errors import GradScopeError
from gradscope.core.history import MISSING, STATISTICS, RunHistory
from gradscope.core.module_tree import build_module_tree
from gradscope.core.origin import Origin
from gradscope.core.recording import (
    FORMAT_VERSION,
    RecordingReader,
    RecordingWriter,
    write_csv,
)
from gradscope.core.watch import STATUS_NONFINITE, GradientWatch

REPO = Path(__file__).resolve().parents[1]


class Gate(nn.Module):
    """Passes its input through until broken; then its own code makes -inf/NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - x.max()) if self.broken else x


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), Gate(), nn.Linear(12, 3), nn.Linear(3, 1))


def train(watch, model, steps, history=None, *, explode_at=None, break_at=None, locate=True):
    """A plain training loop; also fills ``history`` the way ``gradscope run`` does."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    collected = []
    for step in range(steps):
        model[2].broken = step == break_at
        x, y = torch.randn(8, 6), torch.randn(8, 1)
        scale = 1e8 if step == explode_at else 1.0

        def compute_loss(x=x, y=y, scale=scale):
            return nn.functional.mse_loss(model(x), y) * scale

        optimizer.zero_grad()
        loss = compute_loss()
        loss.backward()
        if locate:
            stats = watch.collect(loss, locate=compute_loss)
        else:
            stats = watch.collect(loss)
        collected.append(stats)
        if not stats.nonfinite and step != explode_at:
            optimizer.step()
        if history is not None:
            layers = watch.layers
            history.append(
                stats.step,
                stats.loss,
                stats,
                [la.name for la in layers],
                [la.type_name for la in layers],
                [la.num_params for la in layers],
            )
    return collected


# -- round trip ---------------------------------------------------------------------------
def test_round_trip_values_statuses_events_and_origin(tmp_path):
    path = tmp_path / "run.gsrec"
    model = small_model()
    live = RunHistory()
    settings = {"lr": 0.05, "note": "round trip"}
    with gradscope.watch(model, record=path, settings=settings, explode_threshold=1e3) as watch:
        assert watch.recording is not None and watch.path == path
        collected = train(watch, model, 12, live, explode_at=4, break_at=9)

    with RecordingReader(path) as reader:
        tree, history = reader.load()
        assert reader.is_finished() and not reader.is_live()
        assert reader.settings == settings
        assert reader.format_version == FORMAT_VERSION
        assert reader.loss_recorded.all()
    assert tree is not None and tree.rows() == build_module_tree(model).rows()
    assert history.count == 12 and history.steps.tolist() == list(range(12))
    assert history.layer_names == live.layer_names == ["0", "3", "4"]
    assert history.layer_types == ["Linear"] * 3
    assert history.layer_params == live.layer_params
    for statistic in STATISTICS:
        np.testing.assert_array_equal(history.matrix(statistic), live.matrix(statistic))
    np.testing.assert_array_equal(history.status_matrix(), live.status_matrix())
    for row, stats in enumerate(collected):  # exactly the collected values, as float32
        np.testing.assert_array_equal(
            history.matrix("grad_norm")[row], stats.grad_norm.astype(np.float32)
        )
        measured = stats.max_abs  # None on steps without detail: MISSING, not NaN
        expected = np.full(len(stats.grad_norm), MISSING) if measured is None else measured
        np.testing.assert_array_equal(history.matrix("max_abs")[row], expected.astype(np.float32))
        assert history.losses[row] == stats.loss or (
            np.isnan(history.losses[row]) and np.isnan(stats.loss)
        )
        assert history.total_grad_norm[row] == stats.total_grad_norm or np.isnan(
            stats.total_grad_norm
        )
    assert (history.matrix("update_ratio") == MISSING).all()  # not measured: no value

    assert [history.worst(n) for n in history.layer_names] == [
        live.worst(n) for n in live.layer_names
    ]
    assert history.worst("3") == "nonfinite"
    onsets = [e for e in history.events if e.kind != "origin"]
    assert onsets == live.events and any(e.kind == "exploding" and e.step == 4 for e in onsets)
    origin = history.first_nonfinite
    assert origin is not None
    assert (origin.step, origin.phase, origin.module, origin.op) == (9, "forward", "2", "torch.log")
    assert origin.line and origin.file == __file__
    assert next(e for e in history.events if e.kind == "origin").message == origin.describe()


def test_update_ratio_and_origin_without_locate(tmp_path):
    path = tmp_path / "ratio.gsrec"
    model = small_model()
    optimizer_watch = torch.optim.SGD(model.parameters(), lr=0.05)
    live = RunHistory()
    watch = gradscope.watch(
        model, record=path, update_ratio=True, optimizer=optimizer_watch, detail_every=1
    )
    for step in range(5):
        model[2].broken = step == 3
        optimizer_watch.zero_grad()
        loss = nn.functional.mse_loss(model(torch.randn(8, 6)), torch.randn(8, 1))
        loss.backward()
        stats = watch.collect(loss)
        if not stats.nonfinite:
            optimizer_watch.step()  # the hook measures the update ratio
        live.append(stats.step, stats.loss, stats, [la.name for la in watch.layers])
    watch.close()
    _, history = RecordingReader(path).load()
    ratios = history.matrix("update_ratio")
    assert (ratios[:3] > 0).all() and (ratios[3] == MISSING).all()
    np.testing.assert_array_equal(ratios[:3], live.matrix("update_ratio")[:3])
    origin = history.first_nonfinite
    assert origin is not None and origin.step == 3
    # without locate= the watch repeats the step it captured: the module and line are found
    assert (origin.phase, origin.module, origin.op) == ("forward", "2", "torch.log")
    assert origin.details["repeated"] == "captured step"


def test_record_needs_a_new_file_unless_overwrite(tmp_path):
    path = tmp_path / "twice.gsrec"
    model = small_model()
    with gradscope.watch(model, record=path) as watch:
        train(watch, model, 1)
    # A second run of the same script must not crash: it records next to the first.
    with pytest.warns(UserWarning, match="already exists; recording to .*twice-1.gsrec") as seen:
        second = gradscope.watch(model, record=path)
    assert seen[0].filename == __file__  # the warning points at the user's line
    with second:
        train(second, model, 3)
    assert second.path == tmp_path / "twice-1.gsrec"
    assert RecordingReader(path).load()[1].count == 1
    assert RecordingReader(second.path).load()[1].count == 3
    with pytest.warns(UserWarning, match="twice-2.gsrec"):
        gradscope.watch(model, record=path).close()
    with gradscope.watch(model, record=path, overwrite=True) as watch:
        train(watch, model, 2)
    assert RecordingReader(path).load()[1].count == 2
    not_recording = tmp_path / "notes.txt"
    not_recording.write_text("my notes\n")
    with pytest.raises(GradScopeError, match="not a GradScope recording"):
        gradscope.watch(model, record=not_recording, overwrite=True)
    assert not_recording.read_text() == "my notes\n"
    with pytest.raises(GradScopeError, match="pass record="):
        gradscope.watch(model, settings={"lr": 1})


# -- crash safety -------------------------------------------------------------------------
CHILD = """
import sys, torch
from torch import nn
sys.path.insert(0, {repo!r})
import gradscope
torch.manual_seed(0)
model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(20)))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
watch = gradscope.watch(model, record={path!r}, commit_seconds=0.2)
step = 0
while True:
    optimizer.zero_grad()
    loss = model(torch.randn(4, 16)).square().mean()
    loss.backward()
    stats = watch.collect(loss)
    optimizer.step()
    print(stats.step, repr(float(stats.grad_norm[0])), repr(stats.loss), flush=True)
"""


def test_sigkill_mid_run_leaves_every_committed_step(tmp_path):
    """A real training process writes; this one follows it live, then kills it."""
    path = tmp_path / "killed.gsrec"
    script = tmp_path / "train.py"
    script.write_text(CHILD.format(repo=str(REPO), path=str(path)))
    printed: list[tuple[float, int, float, float]] = []
    follower = followed = None
    follow_reads: list[int] = []
    with subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None and child.stderr is not None
            while True:
                line = child.stdout.readline()
                assert line, child.stderr.read()
                step, norm, loss = line.split()
                printed.append((time.monotonic(), int(step), float(norm), float(loss)))
                if follower is None:  # the header is written before the first step
                    follower = RecordingReader(path)
                    assert follower.is_live()
                    _, followed = follower.load()
                    last_read = time.monotonic()
                elif time.monotonic() - last_read > 0.3:
                    follow_reads.append(follower.read_new_steps(followed))
                    last_read = time.monotonic()
                if printed[-1][0] - printed[0][0] > 2.5:
                    break
            killed_at = time.monotonic()
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL

    assert os.path.exists(f"{path}-wal")  # as the killed writer left it
    reader = RecordingReader(path)
    assert not reader.is_live() and not reader.is_finished()
    _, history = reader.load()
    count = history.count
    assert history.steps.tolist() == list(range(count))  # no holes
    # Every step printed more than a second (5 commit intervals) before the kill is there.
    settled = [p for p in printed if p[0] < killed_at - 1.0]
    assert settled and count >= len(settled), (count, len(settled), len(printed))
    for _, step, norm, loss in printed[:count]:
        assert history.series("grad_norm", "0")[step] == np.float32(norm)
        assert history.losses[step] == loss
    reader.close()

    # The follower saw the steps arrive in several reads while the writer kept going.
    assert follower is not None and followed is not None
    assert sum(n > 0 for n in follow_reads) >= 3, follow_reads
    follower.read_new_steps(followed)
    assert not follower.is_live()
    assert followed.count == count
    np.testing.assert_array_equal(followed.matrix("grad_norm"), history.matrix("grad_norm"))
    follower.close()

    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    connection.close()

    # The dead writer's lock is stale at once: the file can be written again.
    with pytest.raises(GradScopeError, match="already exists"):
        RecordingWriter(path)
    RecordingWriter(path, overwrite=True).close()


# -- one writer ---------------------------------------------------------------------------
def test_second_writer_gets_a_clear_error(tmp_path):
    path = tmp_path / "busy.gsrec"
    model = small_model()
    watch = gradscope.watch(model, record=path)
    try:
        train(watch, model, 2)
        code = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(REPO)!r})
            import gradscope
            from torch import nn
            from gradscope.core.errors import GradScopeError
            try:
                gradscope.watch(nn.Linear(2, 2), record={str(path)!r}, overwrite=True)
            except GradScopeError as error:
                print(error)
                sys.exit(3)
            """
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert result.returncode == 3, result.stderr
        message = result.stdout.strip()
        assert message == (
            f"{path} is being written by process {os.getpid()}; two processes cannot write "
            "one recording (choose another file)"
        )
        with pytest.raises(GradScopeError, match="is being written by process"):
            RecordingWriter(path, overwrite=True)
        reader = RecordingReader(path)
        assert reader.is_live()
        train(watch, model, 2)  # the refused writers changed nothing
    finally:
        watch.close()
    assert not reader.is_live() and reader.load()[1].count == 4


# -- bad files ----------------------------------------------------------------------------
def finished_recording(tmp_path, steps=30, name="good.gsrec"):
    path = tmp_path / name
    model = small_model()
    with gradscope.watch(model, record=path) as watch:
        train(watch, model, steps)
    return path


def assert_report_error(capsys, path, needle):
    code = main(["report", str(path)])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("gradscope: error:") and needle in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_not_a_recording(tmp_path, capsys):
    text = tmp_path / "model.py"
    text.write_text("print('hello')\n")
    other_db = tmp_path / "other.sqlite"
    sqlite3.connect(other_db).execute("CREATE TABLE t(x)").connection.commit()
    empty = tmp_path / "empty.gsrec"
    empty.write_bytes(b"")
    for path in (text, other_db, empty):
        with pytest.raises(GradScopeError, match="is not a GradScope recording"):
            RecordingReader(path)
        assert_report_error(capsys, path, "is not a GradScope recording")
    with pytest.raises(GradScopeError, match="no such recording"):
        RecordingReader(tmp_path / "missing.gsrec")
    assert_report_error(capsys, tmp_path, "is a folder")


def test_truncated_recording(tmp_path, capsys):
    path = finished_recording(tmp_path)
    data = path.read_bytes()
    for size in (len(data) // 2, 60):
        path.write_bytes(data[:size])
        with pytest.raises(GradScopeError, match=r"is damaged.*truncated"):
            RecordingReader(path).load()
        assert_report_error(capsys, path, "truncated")


def test_corrupt_recording(tmp_path, capsys):
    path = finished_recording(tmp_path, steps=60)
    data = bytearray(path.read_bytes())
    page = 4096
    for start in range(3 * page, len(data), 2 * page):  # scribble over every other page
        data[start : start + page] = os.urandom(page)
    path.write_bytes(bytes(data))
    with pytest.raises(GradScopeError, match="is damaged"):
        RecordingReader(path).load()
    assert_report_error(capsys, path, "is damaged")


def test_newer_format_version(tmp_path, capsys):
    path = finished_recording(tmp_path, steps=2)
    connection = sqlite3.connect(path)
    connection.execute(
        "UPDATE meta SET value = ? WHERE key = 'format_version'", (FORMAT_VERSION + 1,)
    )
    connection.commit()
    connection.close()
    with pytest.raises(GradScopeError, match=r"written by a newer GradScope.*update GradScope"):
        RecordingReader(path)
    assert_report_error(capsys, path, "newer GradScope")


# -- following a live recording -----------------------------------------------------------
def test_follow_picks_up_new_steps_while_the_writer_writes(tmp_path):
    path = tmp_path / "live.gsrec"
    model = small_model()
    watch = GradientWatch(model)
    writer = RecordingWriter(path, build_module_tree(model), {"steps": "many"})
    collected = train(watch, model, 5)
    for stats in collected:
        writer.append(stats, watch.layers)
    writer.flush()

    reader = RecordingReader(path)
    assert reader.is_live() and not reader.is_finished()
    tree, history = reader.load()
    assert tree is not None and history.count == 5
    assert reader.read_new_steps(history) == 0

    more = train(watch, model, 7, break_at=4)  # steps 5..11, a NaN at step 9
    for stats in more[:3]:
        writer.append(stats, watch.layers)
    writer.flush()
    assert reader.read_new_steps(history) == 3
    for stats in more[3:]:
        writer.append(stats, watch.layers)
    writer.close()
    assert reader.read_new_steps(history) == 4
    assert not reader.is_live() and reader.is_finished()

    assert history.steps.tolist() == list(range(12))
    full = RecordingReader(path).load()[1]
    for statistic in STATISTICS:
        np.testing.assert_array_equal(history.matrix(statistic), full.matrix(statistic))
    assert history.events == full.events
    assert any(e.kind == "nonfinite" and e.step == 9 for e in history.events)
    assert history.worst("3") == "nonfinite"

    RecordingWriter(path, overwrite=True).close()  # a new run in the same file
    with pytest.raises(GradScopeError, match="replaced by a new recording"):
        reader.read_new_steps(history)


def test_layers_changing_mid_run_and_decimated_load(tmp_path):
    path = tmp_path / "layers.gsrec"
    model = small_model()
    first, second = GradientWatch(model, ["0", "3"]), GradientWatch(model, ["3", "4"])
    second._step = 30  # as StepRunner.set_layers continues the step count
    live = RunHistory()
    with RecordingWriter(path, build_module_tree(model)) as writer:
        for watch, steps, break_at in ((first, 30, None), (second, 30, 20)):
            for stats in train(watch, model, steps, live, break_at=break_at):
                writer.append(stats, watch.layers)
    reader = RecordingReader(path)
    _, history = reader.load()
    assert history.layer_names == ["0", "3", "4"]
    for statistic in STATISTICS:
        np.testing.assert_array_equal(history.matrix(statistic), live.matrix(statistic))
    assert (history.series("grad_norm", "4")[:30] == MISSING).all()
    assert (history.series("grad_norm", "0")[30:] == MISSING).all()

    _, sparse = RecordingReader(path).load(max_rows=10)
    rows = sparse.steps.tolist()
    assert len(rows) < 30 and rows[0] == 0 and rows[-1] == 59
    assert set(rows) >= {e.step for e in history.events}  # every event step is kept
    assert [sparse.worst(n) for n in sparse.layer_names] == [
        history.worst(n) for n in history.layer_names
    ]
    for row, step in enumerate(rows):
        np.testing.assert_array_equal(
            sparse.matrix("grad_norm")[row], history.matrix("grad_norm")[step]
        )
    window = reader.read_window(25, 45)  # a zoomed-in view, at full resolution
    assert window.steps.tolist() == list(range(25, 45))
    assert window.layer_names == history.layer_names
    for statistic in STATISTICS:
        np.testing.assert_array_equal(window.matrix(statistic), history.matrix(statistic)[25:45])
    assert window.events == [e for e in history.events if 25 <= e.step < 45]
    coarse = reader.read_window(10, 60, max_rows=5)
    assert coarse.steps.tolist()[:3] == [10, 20, 30] and coarse.steps[-1] == 59
    assert set(coarse.steps.tolist()) >= {e.step for e in history.events if e.step >= 10}
    assert reader.read_new_steps(history) == 0 and history.count == 60  # follow untouched
    steps, values = reader.read_statistic("grad_norm", "4", start_row=25, stride=5)
    assert steps.tolist() == [25, 30, 35, 40, 45, 50, 55]
    np.testing.assert_array_equal(values, history.series("grad_norm", "4")[25::5])
    _, status = reader.read_statistic("status", "3")
    np.testing.assert_array_equal(status, history.status_matrix()[:, 1])
    assert status[50] == STATUS_NONFINITE


def test_steps_are_dropped_not_waited_for_when_the_disk_stalls(tmp_path):
    path = tmp_path / "stall.gsrec"
    model = small_model()
    watch = GradientWatch(model)
    collected = train(watch, model, 8)
    writer = RecordingWriter(path, build_module_tree(model), commit_steps=1, max_pending=2)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another connection holds the write lock: a stall
    try:
        with pytest.warns(RuntimeWarning, match="steps are being dropped"):
            started = time.perf_counter()
            accepted = [writer.append(stats, watch.layers) for stats in collected[:6]]
            assert time.perf_counter() - started < 0.5  # never waited for the disk
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert not all(accepted) and writer.dropped == accepted.count(False)
    writer.flush()
    writer.append(collected[6], watch.layers)
    writer.append(collected[7], watch.layers)
    writer.close()
    _, history = RecordingReader(path).load()
    kept = [s.step for s, ok in zip(collected[:6], accepted, strict=True) if ok] + [6, 7]
    assert history.steps.tolist() == kept
    gap = [e for e in history.events if e.kind == "gap"]
    assert gap and "not recorded" in gap[0].message


# -- gradscope report ---------------------------------------------------------------------
NAN_SCRIPT = """
import torch
from torch import nn

class Log(nn.Module):
    def forward(self, x):
        return torch.log(x - x.max())
def build_model():
    return nn.Sequential(nn.Linear(10, 50), nn.ReLU(), Log(), nn.Linear(50, 1))
def make_batch(batch_size, device):
    return torch.randn(batch_size, 10, device=device), torch.randn(batch_size, 1, device=device)
"""


def keys(value):
    """The shape of a JSON value: dict keys, recursively, and the element shape of lists."""
    if isinstance(value, dict):
        return {k: keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [keys(value[0])] if value and isinstance(value[0], (dict, list)) else []
    return None


def test_report_json_has_the_schema_of_run_json(tmp_path, capsys, write_script):
    script = write_script(NAN_SCRIPT)
    run_json = tmp_path / "run.json"
    assert main(["run", str(script), "--steps", "3", "--json", str(run_json)]) == 0
    run_out = capsys.readouterr().out

    namespace: dict = {}
    exec(compile(NAN_SCRIPT, str(script), "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["build_model"]()
    recording = tmp_path / "loop.gsrec"
    with gradscope.watch(model, record=recording, settings={"source": str(script)}) as watch:
        x, y = namespace["make_batch"](8, "cpu")

        def compute_loss():
            return nn.functional.mse_loss(model(x), y)

        loss = compute_loss()
        loss.backward()
        watch.collect(loss, locate=compute_loss)

    report_json = tmp_path / "report.json"
    report_csv = tmp_path / "report.csv"
    argv = ["report", str(recording), "--json", str(report_json), "--csv", str(report_csv)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert main([*argv, "--fail-on-nonfinite"]) == 1
    capsys.readouterr()

    run_data = json.loads(run_json.read_text())
    report_text = report_json.read_text()
    report_data = json.loads(report_text, parse_constant=pytest.fail)  # strict JSON
    # The settings are each run's own (RunSettings for `run`, the dict given to watch()).
    assert keys({**report_data, "settings": None}) == keys({**run_data, "settings": None})
    assert set(report_data) == {
        "source",
        "device",
        "world_size",
        "settings",
        "steps_run",
        "steps",
        "loss",
        "total_grad_norm",
        "first_nonfinite",
        "nonfinite_origins",
        "error",
        "run_events",
        "warnings",
        "layers",
    }
    assert report_data["settings"] == {"source": str(script)}
    assert report_data["world_size"] is None and run_data["world_size"] == 1  # not recorded
    assert report_data["steps"] == run_data["steps"] == [0]
    assert report_data["total_grad_norm"] == run_data["total_grad_norm"] == ["nan"]
    assert report_data["error"] is None
    assert report_data["source"] == run_data["source"] == str(script)
    assert report_data["device"] == run_data["device"] == "cpu"
    assert report_data["steps_run"] == run_data["steps_run"] == 1
    assert report_data["loss"] == run_data["loss"] == ["nan"]
    for field in ("step", "phase", "module", "tensor", "kind", "op", "line", "code"):
        assert report_data["first_nonfinite"][field] == run_data["first_nonfinite"][field]
    assert [la["name"] for la in report_data["layers"]] == [la["name"] for la in run_data["layers"]]
    assert [la["status"] for la in report_data["layers"]] == ["nonfinite", "nonfinite"]
    # The printed summary is the same table and the same origin line.
    for line in (ln for ln in run_out.splitlines() if ln.startswith(("first non-finite", "layer"))):
        assert line in out

    with report_csv.open() as file:
        rows = list(csv.DictReader(file))
    assert [(r["step"], r["layer"], r["status"]) for r in rows] == [
        ("0", "0", "nonfinite"),
        ("0", "3", "nonfinite"),
    ]
    assert rows[0]["grad_norm"] == "nan" and rows[0]["update_ratio"] == ""


def test_csv_export_values(tmp_path):
    path = finished_recording(tmp_path, steps=6)
    _, history = RecordingReader(path).load()
    out = tmp_path / "all.csv"
    assert write_csv(history, out) == 6 * 3
    with out.open() as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["step", "layer", *STATISTICS, "status"]
    for row in rows:
        column = history.column(row["layer"])
        index = int(row["step"])
        for statistic in ("grad_norm", "max_abs", "weight_norm"):
            value = history.matrix(statistic)[index, column]
            if value == MISSING:  # a step without detail: an empty cell
                assert row[statistic] == ""
            else:
                assert np.float32(row[statistic]) == value
    assert write_csv(history, tmp_path / "one.csv", layers=["3"]) == 6
    with pytest.raises(GradScopeError, match="no layer 'nope'"):
        write_csv(history, tmp_path / "x.csv", layers=["nope"])


def test_steps_without_loss_and_the_split_launch_resolve_api(tmp_path, capsys):
    path = tmp_path / "noloss.gsrec"
    model = small_model()
    with gradscope.watch(model, record=path) as watch:
        for _ in range(2):
            model.zero_grad()
            model(torch.randn(4, 6)).sum().backward()
            watch.collect()  # no loss given
        model.zero_grad()
        loss = model(torch.randn(4, 6)).sum()
        loss.backward()
        resolved = watch.resolve(watch.launch(loss))  # the split API is recorded too
    reader = RecordingReader(path)
    _, history = reader.load()
    assert history.count == 3 and reader.loss_recorded.tolist() == [False, False, True]
    assert history.losses[2] == resolved.loss
    np.testing.assert_array_equal(
        history.matrix("grad_norm")[2], resolved.grad_norm.astype(np.float32)
    )
    out_json = tmp_path / "noloss.json"
    assert main(["report", str(path), "--json", str(out_json), "--fail-on-nonfinite"]) == 0
    out = capsys.readouterr().out
    assert ": 3 step(s), loss" in out and "first non-finite" not in out
    data = json.loads(out_json.read_text())
    assert data["loss"][:2] == [None, None] and data["loss"][2] == resolved.loss


def test_lock_of_a_writer_elsewhere_until_its_heartbeat_is_stale(tmp_path):
    path = finished_recording(tmp_path, steps=2)

    def forge_lock(host, age, token="someone-else"):
        connection = sqlite3.connect(path)
        connection.execute("DELETE FROM writer_lock")
        connection.execute(
            "INSERT INTO writer_lock(id, pid, host, token, heartbeat) VALUES (1, 4242, ?, ?, ?)",
            (host, token, time.time() - age),
        )
        connection.commit()
        connection.close()

    forge_lock("build-server-7", age=1)  # a live writer on another machine
    assert RecordingReader(path).is_live()
    with pytest.raises(GradScopeError, match="being written by process 4242 on build-server-7"):
        RecordingWriter(path, overwrite=True)
    forge_lock("build-server-7", age=120)  # it stopped beating long ago: stale
    assert not RecordingReader(path).is_live()
    writer = RecordingWriter(path, overwrite=True)

    # If the lock is taken from a live writer, it stops at its next commit instead of
    # interleaving its steps with the new owner's.
    forge_lock("build-server-7", age=0, token="new-owner")
    with pytest.warns(RuntimeWarning, match="took over"):
        with pytest.raises(GradScopeError, match="another process took over"):
            writer.close()


def test_exiting_without_close_still_writes_every_step(tmp_path):
    path = tmp_path / "unclosed.gsrec"
    code = textwrap.dedent(
        f"""
        import sys, torch
        from torch import nn
        sys.path.insert(0, {str(REPO)!r})
        import gradscope
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        watch = gradscope.watch(
            model, record={str(path)!r}, update_ratio=True, optimizer=optimizer, detail_every=1
        )
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(torch.randn(2, 3)).sum()
            loss.backward()
            watch.collect(loss)
            optimizer.step()
        """
    )  # no watch.close(): the last step still waits for its update ratio at exit
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    reader = RecordingReader(path)
    _, history = reader.load()
    assert reader.is_finished() and history.count == 3
    assert (history.matrix("update_ratio") > 0).all()


def test_rewind_drops_the_abandoned_branch_for_readers_and_followers(tmp_path):
    path = tmp_path / "rewound.gsrec"
    model = small_model()
    watch = GradientWatch(model)
    live = RunHistory()
    writer = RecordingWriter(path, build_module_tree(model))
    for stats in train(watch, model, 10, live, break_at=7):  # a NaN at step 7
        origin = Origin(7, "forward", "2", "output", "nan") if stats.step == 7 else None
        writer.append(stats, watch.layers, origin=origin)
    writer.flush()
    follower = RecordingReader(path)
    _, followed = follower.load()
    assert followed.count == 10 and followed.worst("3") == "nonfinite"
    assert followed.first_nonfinite is not None

    # The app rewinds to step 5 and trains a finite new branch from there.
    writer.rewind_to(5)
    live.rewind_to(5)
    watch._step = 5  # as StepRunner.rewind sets the watch's step
    for stats in train(watch, model, 4, live):
        writer.append(stats, watch.layers)
    writer.flush()
    assert follower.read_new_steps(followed) == 4
    writer.close()

    _, fresh = RecordingReader(path).load()
    for history in (fresh, followed):
        assert history.steps.tolist() == list(range(9))
        for statistic in STATISTICS:
            np.testing.assert_array_equal(history.matrix(statistic), live.matrix(statistic))
        # The recording keeps what the abandoned branch found, as a "rewind" event.
        rewinds = [e for e in history.events if e.kind == "rewind"]
        assert len(rewinds) == 1 and rewinds[0].step == 5
        assert "steps 5-9" in rewinds[0].message and "step 7" in rewinds[0].message
        assert [e for e in history.events if e.kind != "rewind"] == live.events
        assert not any(e.step >= 5 and e.kind == "nonfinite" for e in history.events)
        assert [history.worst(n) for n in history.layer_names] == [
            live.worst(n) for n in live.layer_names
        ]
        assert "nonfinite" not in {history.worst(n) for n in history.layer_names}
        assert history.first_nonfinite is None


def test_report_json_steps_and_total_grad_norm_after_a_rewind(tmp_path, capsys):
    path = tmp_path / "rewound.gsrec"
    model = small_model()
    watch = GradientWatch(model)
    writer = RecordingWriter(path, build_module_tree(model), settings={"lr": 0.05})
    collected = train(watch, model, 4)
    for stats in collected:
        writer.append(stats, watch.layers)
    writer.rewind_to(2)
    watch._step = 2
    for stats in train(watch, model, 3):
        collected.append(stats)
        writer.append(stats, watch.layers)
    writer.close()
    report = tmp_path / "r.json"
    assert main(["report", str(path), "--json", str(report)]) == 0
    capsys.readouterr()
    data = json.loads(report.read_text())
    assert data["steps"] == [0, 1, 2, 3, 4]
    expected = [s.total_grad_norm for s in collected[:2] + collected[4:]]
    np.testing.assert_allclose(data["total_grad_norm"], expected, rtol=1e-12)
    assert data["settings"] == {"lr": 0.05}


def test_invalid_settings_json_is_one_clear_error(tmp_path, capsys):
    path = finished_recording(tmp_path, steps=2)
    for text, needle in (("{bad", "not valid JSON"), ("[1, 2]", "a JSON list")):
        connection = sqlite3.connect(path)
        connection.execute("UPDATE meta SET value = ? WHERE key = 'settings'", (text,))
        connection.commit()
        connection.close()
        with pytest.raises(GradScopeError, match=needle):
            RecordingReader(path)
        assert_report_error(capsys, path, needle)


def test_a_failed_writer_releases_its_lock_at_once(tmp_path, monkeypatch):
    path = tmp_path / "failing.gsrec"
    model = small_model()
    watch = GradientWatch(model)
    collected = train(watch, model, 3)
    writer = RecordingWriter(path, build_module_tree(model), commit_steps=1)
    writer.append(collected[0], watch.layers)
    writer.flush()
    assert RecordingReader(path).is_live()

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_pack", fail)  # the writer thread's next batch fails
    with pytest.warns(RuntimeWarning, match="No space left"):
        writer.append(collected[1], watch.layers)  # the thread may fail before flush()
        with pytest.raises(GradScopeError, match="No space left"):
            writer.flush()
    with RecordingReader(path) as reader:
        assert not reader.is_live()  # not "live" for the next 30 s
        assert reader.row_count() == 1
    writer.close()


def test_report_output_cut_short_by_the_reader_is_no_error(tmp_path):
    path = finished_recording(tmp_path, steps=3)
    report = tmp_path / "r.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "gradscope", "report", str(path), "--json", str(report)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.close()  # `| head` that has read enough
    err = process.stderr.read()
    process.wait(timeout=120)
    assert process.returncode == 0, err
    assert "BrokenPipe" not in err and "Traceback" not in err
    assert json.loads(report.read_text())["steps_run"] == 3


# -- wall-clock time and per-parameter norms ------------------------------------------------
def test_wall_time_and_parameter_norms_round_trip_also_when_layers_change(tmp_path):
    path = tmp_path / "params.gsrec"
    model = small_model()
    first, second = GradientWatch(model, ["0", "3"]), GradientWatch(model, ["3", "4"])
    second._step = 10
    collected = []
    with RecordingWriter(path, build_module_tree(model)) as writer:
        for watch, steps in ((first, 10), (second, 10)):
            for stats in train(watch, model, steps):
                writer.append(stats, watch.layers)
                collected.append((watch, stats))
    reader = RecordingReader(path)
    assert reader.has_wall_time and reader.has_parameter_norms
    _, history = reader.load()
    assert history.has_wall_time()
    np.testing.assert_array_equal(history.wall_time[:20], [s.wall_time for _, s in collected])
    norms = history.parameter_norms
    assert norms.layer_names == ["0.weight", "0.bias", "3.weight", "3.bias", "4.weight", "4.bias"]
    assert norms.owner == ["0", "0", "3", "3", "4", "4"]
    assert norms.params_of(["3"]) == ["3.weight", "3.bias"]
    for row, (watch, stats) in enumerate(collected):
        for name, value in zip(watch.param_names, stats.param_grad_norm, strict=True):
            assert norms.series("grad_norm", name)[row] == np.float32(value)
    assert (norms.series("grad_norm", "0.weight")[10:] == MISSING).all()
    assert (norms.series("grad_norm", "4.bias")[:10] == MISSING).all()
    _, sparse = RecordingReader(path).load(max_rows=5)  # decimated: the same rows kept
    np.testing.assert_array_equal(sparse.parameter_norms.steps, sparse.steps)
    follower = RecordingReader(path)
    _, followed = follower.load()
    assert follower.read_new_steps(followed) == 0
    assert followed.parameter_norms.count == 20


def test_a_recording_without_wall_time_and_parameter_norms_still_opens(tmp_path):
    """A file written before steps were stamped (no steps.wall_time, no parameter tables)."""
    path = tmp_path / "older.gsrec"
    model = small_model()
    with gradscope.watch(model, record=path) as watch:
        train(watch, model, 4)
    connection = sqlite3.connect(path)
    for table in ("params", "param_sets", "param_grad_norm"):
        connection.execute(f"DROP TABLE {table}")
    connection.execute("ALTER TABLE steps DROP COLUMN wall_time")
    connection.commit()
    connection.close()
    reader = RecordingReader(path)
    assert not reader.has_wall_time and not reader.has_parameter_norms
    _, history = reader.load()
    assert history.count == 4 and not history.has_wall_time()
    assert history.parameter_norms.count == 0
    assert reader.read_new_steps(history) == 0
