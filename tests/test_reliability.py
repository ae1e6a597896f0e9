"""Reliability, second pass (issue 26): crafted and corrupt recordings are one message and
exit 2 from every route that opens them; a full disk never breaks training; a BaseException
from user code keeps the finished steps; the CLI does not hang on a thread a script left
running; messages say what happened."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.errors import GradScopeError
from gradscope.core.recording import RecordingReader
from gradscope.core.watch import GradientWatch

REPO = Path(__file__).resolve().parents[1]


class Gate(nn.Module):
    """Passes its input through until broken; then its own code makes -inf/NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - x.max()) if self.broken else x


def record_real_run(path: Path, steps: int = 8) -> Path:
    """A real recording: a module tree, an exploding onset at step 2, a NaN origin at step 5
    (located), update ratios, so every table the reader reads holds rows."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), Gate(), nn.Linear(12, 3), nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with gradscope.watch(
        model, record=path, update_ratio=True, optimizer=optimizer, settings={"lr": 0.05}
    ) as watch:
        for step in range(steps):
            model[2].broken = step == 5
            x, y = torch.randn(8, 6), torch.randn(8, 1)
            scale = 1e8 if step == 2 else 1.0

            def compute_loss(x=x, y=y, scale=scale):
                return nn.functional.mse_loss(model(x), y) * scale

            optimizer.zero_grad()
            loss = compute_loss()
            loss.backward()
            stats = watch.collect(loss, locate=compute_loss)
            if not stats.nonfinite and step != 2:
                optimizer.step()
    return path


@pytest.fixture(scope="module")
def real_recording(tmp_path_factory) -> Path:
    return record_real_run(tmp_path_factory.mktemp("real") / "real.gsrec")


# One SQL statement each, applied to a copy of the real recording, with what the one line
# must say. (SQLite turns a number written to a TEXT column into text, so a wrong type
# there is a BLOB.)
CRAFTED = {
    "origin is {}": ("UPDATE origins SET data = '{}'", "origin lacks step"),
    "origin is a JSON list": ("UPDATE origins SET data = '[1, 2]'", "origin is a JSON list"),
    "origin is not JSON": ("UPDATE origins SET data = 'step 5'", "not valid JSON"),
    "origin kind is a number": (
        'UPDATE origins SET data = replace(data, \'"kind": "nan"\', \'"kind": 5\')',
        "origin's kind is an integer",
    ),
    "origin details are a list": (
        'UPDATE origins SET data = replace(data, \'"details": {\', \'"details": [1], "x": {\')',
        "origin's details are a JSON list",
    ),
    "layer set positions are text": (
        "UPDATE layer_sets SET positions = 'abc'",
        "positions is text, not a BLOB",
    ),
    "layer set names a missing layer": (
        "UPDATE layer_sets SET positions = X'FFFFFF7F00000000FFFFFFFF'",
        "layers the recording does not have",
    ),
    "grad_norm blob is text": (
        "UPDATE grad_norm SET data = 'text' WHERE row = 3",
        "grad_norm values is text, not a BLOB",
    ),
    "status blob is an integer": (
        "UPDATE status SET data = 7 WHERE row = 2",
        "status values is an integer, not a BLOB",
    ),
    "status blob is short": (
        "UPDATE status SET data = X'02' WHERE row = 1",
        "do not match their layers",
    ),
    "update_ratio blob is a real": (
        "UPDATE update_ratio SET data = 1.5 WHERE row = 3",
        "update_ratio values is a real number",
    ),
    "unknown layer set": ("UPDATE steps SET layer_set = 99 WHERE row = 0", "is damaged"),
    "step number is text": ("UPDATE steps SET step = 'soon' WHERE row = 4", "is damaged"),
    "no creation time": ("DELETE FROM meta WHERE key = 'created'", "no creation time"),
    "format version is text": (
        "UPDATE meta SET value = 'two' WHERE key = 'format_version'",
        "no format version",
    ),
    "layer parameter count is text": (
        "UPDATE layers SET params = 'many' WHERE position = 0",
        "parameter count is text",
    ),
    "layer name is a BLOB": (
        "UPDATE layers SET name = X'6162' WHERE position = 1",
        "a layer's name is a BLOB",
    ),
    "event kind is a BLOB": ("UPDATE events SET kind = X'00'", "an event's kind is a BLOB"),
    "event step is text": ("UPDATE events SET step = 'soon'", "an event's step is text"),
    "tree name is a BLOB": ("UPDATE tree SET name = X'00' WHERE position = 1", "module's name"),
    "tree parameter count is text": (
        "UPDATE tree SET own_params = 'x' WHERE position = 0",
        "parameter count is text",
    ),
    "source is a BLOB": (
        "UPDATE meta SET value = X'00FF' WHERE key = 'info.source'",
        "meta.info.source is a BLOB",
    ),
    "a table is gone": ("DROP TABLE rewinds", "missing tables rewinds"),
}


def crafted(real: Path, folder: Path, name: str) -> Path:
    statement, _ = CRAFTED[name]
    path = folder / (name.replace(" ", "_") + ".gsrec")
    shutil.copyfile(real, path)
    connection = sqlite3.connect(path)
    connection.execute(statement)
    assert connection.total_changes or statement.startswith("DROP"), f"{name}: no row changed"
    connection.commit()
    connection.close()
    return path


def assert_one_line(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradscope: error:"), err
    assert needle in lines[0], err


def test_the_real_recording_reads_back(real_recording, capsys):
    """The base of the crafted files is a healthy recording (so each edit is the damage)."""
    assert main(["report", str(real_recording)]) == 0
    out = capsys.readouterr().out
    assert "first non-finite value: step 5" in out
    with RecordingReader(real_recording) as reader:
        _, history = reader.load()
    assert history.count == 8 and history.origins and history.events


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_recording_is_one_line_and_exit_2(
    real_recording, tmp_path, capsys, monkeypatch, name
):
    path = crafted(real_recording, tmp_path, name)
    needle = CRAFTED[name][1]
    assert_one_line(main(["report", str(path)]), capsys.readouterr().err, needle)
    # gradscope open checks the file before any window opens (the window is the app test's)
    monkeypatch.setattr("gradscope.cli.app.app_launcher", lambda: lambda **_: 0)
    assert_one_line(main(["open", str(path)]), capsys.readouterr().err, needle)
    with pytest.raises(GradScopeError, match="is damaged"):
        with RecordingReader(path) as reader:
            reader.load()
            reader.load(max_rows=3)  # the decimated read the app does
            for layer in reader.layer_names:
                reader.read_statistic("grad_norm", layer)
                reader.read_statistic("status", layer)


def test_missing_creation_time_is_not_called_a_replaced_file(real_recording, tmp_path):
    path = crafted(real_recording, tmp_path, "no creation time")
    with pytest.raises(GradScopeError) as raised:
        RecordingReader(path).load()
    assert "replaced" not in str(raised.value)


def test_a_header_claiming_a_huge_size_is_one_line(real_recording, tmp_path, capsys):
    """The SQLite header's page count says 16 TiB: one line, nothing of that size read."""
    path = tmp_path / "huge.gsrec"
    data = bytearray(real_recording.read_bytes())
    data[28:32] = (0xFFFFFFFF).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    assert_one_line(main(["report", str(path)]), capsys.readouterr().err, "is damaged")


# -- a full disk while recording ----------------------------------------------------------
@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs (as root); skipped with the reason where it cannot be mounted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command to make a small disk")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or 'not root'}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def deep_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(200)])


def test_a_full_disk_stops_the_recording_with_one_warning(full_disk):
    path = full_disk / "run.gsrec"
    model = deep_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    after_close = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watch = gradscope.watch(model, record=path, commit_seconds=0.01)
        for _ in range(300):  # about 5 kB a step: the disk fills within the first 100
            optimizer.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            watch.collect(loss)  # never raises for it
            optimizer.step()
        watch.close()  # nor does this: the script's next line runs
        after_close.append("checkpoint saved")
    assert after_close == ["checkpoint saved"]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    (message,) = messages
    assert f"recording to {path} stopped: the disk {full_disk} is full" in message, message
    assert "rollback" not in message
    committed = int(re.search(r"the (\d+) step\(s\) committed", message).group(1))
    assert committed > 0
    with RecordingReader(path) as reader:  # what was committed stays readable
        _, history = reader.load()
    assert history.count == committed and history.steps.tolist() == list(range(committed))


def test_creating_a_recording_on_a_full_disk_leaves_no_file(full_disk):
    with open(full_disk / "filler", "wb", buffering=0) as filler:  # fill the disk
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass
    path = full_disk / "new.gsrec"
    with pytest.raises(
        GradScopeError, match=rf"cannot write a recording at .*the disk {full_disk} is full"
    ):
        gradscope.watch(nn.Linear(2, 2), record=path)
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]


# -- a BaseException from user code ------------------------------------------------------
BASE_EXCEPTION_SCRIPT = """
import asyncio
import torch
from torch import nn

class Stop(BaseException):
    pass

calls = {{"batch": 0, "forward": 0}}

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x):
        calls["forward"] += 1
        if {in_forward} and calls["forward"] == 4:
            raise asyncio.CancelledError("cancelled in forward")
        return self.layer(x)

def build_model():
    return Net()

def make_batch(batch_size, device):
    calls["batch"] += 1
    if not {in_forward} and calls["batch"] == 4:
        raise Stop("stopped in make_batch")
    return torch.randn(batch_size, 4), torch.randn(batch_size, 1)
"""


@pytest.mark.parametrize(
    "in_forward, needle",
    [(False, "make_batch() raised Stop: stopped in make_batch"), (True, "CancelledError")],
)
def test_a_base_exception_from_user_code_is_exit_2_with_the_finished_steps(
    write_script, tmp_path, capsys, in_forward, needle
):
    path = write_script(BASE_EXCEPTION_SCRIPT.format(in_forward=in_forward))
    report = tmp_path / "run.json"
    code = main(["run", str(path), "--steps", "6", "--json", str(report)])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("gradscope: error:") and needle in err.splitlines()[0], err
    assert f'File "{path}"' in err  # the user's frames
    assert "gradscope/core" not in err and "gradscope/cli" not in err, err
    assert "Traceback" not in err
    assert "the 3 finished step(s)" in err
    assert "3 step(s)" in out and "layer" in out  # the summary
    data = json.loads(report.read_text())
    assert data["steps"] == [0, 1, 2]
    assert data["error"]["step"] == 3 and needle in data["error"]["message"]
    assert any(path.name in line for line in data["error"]["traceback"])


# -- a thread the model script leaves running ----------------------------------------------
def checkout_env() -> dict[str, str]:
    """The environment for a subprocess that runs this checkout's gradscope."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def test_a_thread_the_script_leaves_running_does_not_hang_the_run(write_script, tmp_path):
    path = write_script(
        textwrap.dedent(
            """
            import threading
            import torch
            from torch import nn

            def build_model():
                # A data loader's helper, say, that nobody stops (not a daemon).
                threading.Thread(target=threading.Event().wait, name="stuck-loader").start()
                return nn.Linear(4, 1)

            def make_batch(batch_size, device):
                return torch.randn(batch_size, 4), torch.randn(batch_size, 1)
            """
        )
    )
    report = tmp_path / "run.json"
    result = subprocess.run(
        [sys.executable, "-m", "gradscope", "run", str(path), "--steps", "2", "--json", report],
        capture_output=True,
        text=True,
        timeout=90,
        env=checkout_env(),
    )
    assert result.returncode == 0, result.stderr
    assert "2 step(s)" in result.stdout and json.loads(report.read_text())["steps"] == [0, 1]
    assert "not waiting for 1 thread(s) the model left running ('stuck-loader')" in (result.stderr)


# -- messages that say what happened ---------------------------------------------------
def assert_run_error(capsys, argv, needle, absent=()):
    code = main(["run", *map(str, argv)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("gradscope: error:") and needle in err, err
    for word in absent:
        assert word not in err, err


def test_a_script_with_nul_bytes_is_named_as_such(tmp_path, capsys):
    path = tmp_path / "model.py"
    path.write_bytes("def build_model():\n    return 1\n".encode("utf-16"))
    assert_run_error(capsys, [path], "holds NUL bytes", absent=["line None"])


def test_random_bytes_as_weights_are_not_called_python_objects(tmp_path, capsys):
    import random

    path = tmp_path / "weights.pt"
    path.write_bytes(random.Random(0).randbytes(3000))
    assert_run_error(
        capsys,
        ["squeezenet1_1", "--weights", path, "--steps", 1],
        "is not a PyTorch weights file",
        absent=["Python objects"],
    )
    # A pickle of a class of the user's is what "Python objects" means.
    pickled = tmp_path / "objects.pt"
    torch.save({"weight": torch.zeros(2), "extra": Gate()}, pickled)
    assert_run_error(
        capsys, ["squeezenet1_1", "--weights", pickled, "--steps", 1], "Python objects"
    )


# -- tests for the mutations that survived the suite ---------------------------------------
def test_exploding_means_above_the_threshold_not_at_it():
    from gradscope.core.watch import STATUS_EXPLODING, STATUS_OK, STATUS_VANISHING, classify

    at, above = 1000.0, float(np.nextafter(1000.0, np.inf))
    status = classify(np.array([at, above, 1e-7]), np.zeros(3, np.int64), at, 1e-7)
    assert status.tolist() == [STATUS_OK, STATUS_EXPLODING, STATUS_OK]
    # Through a watch on real gradients: a threshold equal to a layer's norm is not exceeded.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    model(torch.randn(8, 4)).pow(2).mean().backward()
    norm = float(GradientWatch(model).collect().grad_norm[0])
    for threshold, expected in ((norm, STATUS_OK), (np.nextafter(norm, 0.0), STATUS_EXPLODING)):
        watch = GradientWatch(model, explode_threshold=float(threshold))
        assert watch.collect().status[0] == expected, (threshold, norm)
    assert STATUS_VANISHING not in status


class NanGradient(torch.autograd.Function):
    """Finite forward, NaN backward: the gradients of every layer before it go NaN."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


class NanInBackward(nn.Module):
    def forward(self, x):
        return NanGradient.apply(x)


def test_a_statistics_only_backward_origin_names_the_last_nonfinite_layer():
    """Gradients flow from the last layer to the first, so of the layers whose gradients
    went NaN the last registered one is where it came in (layer "1" here, not "0")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), NanInBackward(), nn.Linear(4, 1))
    watch = GradientWatch(model, replay=False)  # the statistics alone: no captured step
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    stats = watch.collect(loss)  # no locate: the statistics alone
    origin = stats.origin
    assert origin is not None and origin.phase == "backward"
    assert origin.details["nonfinite_layers"] == ["0", "1"]
    assert origin.module == "1"


def test_the_gap_event_names_exactly_the_steps_not_recorded(tmp_path):
    """Steps are dropped while the disk stalls: each gap event names exactly the steps
    between the recorded step before it and its own (its first and last included)."""
    from gradscope.core.module_tree import build_module_tree
    from gradscope.core.recording import RecordingWriter

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    watch = GradientWatch(model)
    collected = []
    for _ in range(10):
        model.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        collected.append(watch.collect())
    path = tmp_path / "gap.gsrec"
    writer = RecordingWriter(path, build_module_tree(model), commit_steps=100, max_pending=2)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another connection holds the write lock: a stall
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            # The writer thread can take one batch off the queue, then waits for the lock:
            # of 9 steps at most 4 fit, the rest are dropped.
            accepted = [writer.append(stats, watch.layers) for stats in collected[:9]]
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    writer.flush()
    assert writer.append(collected[9], watch.layers)
    writer.close()
    with RecordingReader(path) as reader:
        _, history = reader.load()
    recorded = history.steps.tolist()
    assert recorded == [s for s, ok in enumerate(accepted) if ok] + [9]
    gaps = [e for e in history.events if e.kind == "gap"]
    assert gaps and accepted.count(False) >= 5
    for gap in gaps:
        before = recorded[recorded.index(gap.step) - 1]
        expected = f"steps {before + 1}-{gap.step - 1}: not recorded"
        assert gap.message.startswith(expected), (gap.message, accepted)
