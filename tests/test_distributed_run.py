"""``gradscope run --nproc 2 [--fsdp]`` and per-rank recordings read as a set: real
processes (gloo on CPU, 127.0.0.1), bounded in time; a hang fails with every rank's stacks
(the launcher's --step-timeout, and each test worker's own limit)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from models.distributed_workers import free_port
from models.rank_recording_worker import (
    NAN_RANK,
    NAN_STEP,
    STEPS,
    record_rank_set,
)

from gradscope.cli import main

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)

SCRIPT = Path(__file__).parent / "models" / "rank_fault_model.py"


def run(capsys, *argv):
    code = main(["run", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_nproc_2_gives_each_rank_its_batch_and_names_the_rank_whose_batch_held_a_nan(
    tmp_path, capsys, monkeypatch
):
    single = tmp_path / "single.json"
    assert run(capsys, SCRIPT, "--steps", "1", "--json", single)[0] == 0
    monkeypatch.setenv("RANK_FAULT", "nan:1:1")  # rank 1's batch of step 1 holds a NaN
    report_path = tmp_path / "ranks.json"
    code, out, err = run(capsys, SCRIPT, "--nproc", "2", "--steps", "3", "--json", report_path)
    assert code == 0, err
    report = json.loads(report_path.read_text())
    one = json.loads(single.read_text())
    assert report["world_size"] == 2 and report["error"] is None
    rank0, rank1 = report["ranks"]
    # Both ranks stop at step 1 (the run halts at a NaN), each with its own losses.
    assert rank0["steps"] == rank1["steps"] == [0, 1] == report["steps"]
    assert rank0["loss"] == report["loss"]  # the table and JSON are rank 0's
    # Rank 0 draws the batches a one-process run draws; rank 1 others.
    assert rank0["loss"][0] == pytest.approx(one["loss"][0], rel=1e-6)
    assert rank1["loss"][0] != pytest.approx(rank0["loss"][0], rel=1e-3)
    assert rank1["loss"][1] == "nan" and rank0["loss"][1] != "nan"
    # DDP averaged the two ranks' gradients: rank 0's step-0 norms are not its own batch's.
    head0 = next(layer for layer in report["layers"] if layer["name"] == "head")
    head1 = next(layer for layer in one["layers"] if layer["name"] == "head")
    assert head0["grad_norm"][0] != pytest.approx(head1["grad_norm"][0], rel=1e-3)
    # Which rank broke: rank 1's batch; rank 0 saw the NaN only through the all-reduce.
    assert report["first_nonfinite_rank"] == NAN_RANK == 1
    assert rank1["first_nonfinite"] == {"step": 1, "cause": "batch"}
    assert rank0["first_nonfinite"] == {"step": 1, "cause": "gradients"}
    assert report["first_nonfinite"]["rank"] == 1 and report["first_nonfinite"]["step"] == 1
    assert "first rank to go non-finite: rank 1" in out
    assert "first non-finite value (rank 1)" in out


def test_nproc_2_fsdp_completes_with_per_rank_losses(tmp_path, capsys):
    report_path = tmp_path / "fsdp.json"
    code, out, err = run(
        capsys, SCRIPT, "--nproc", "2", "--fsdp", "--steps", "2", "--json", report_path
    )
    report = json.loads(report_path.read_text())
    assert code == 0, err
    assert report["world_size"] == 2 and report["error"] is None
    assert [len(rank["loss"]) for rank in report["ranks"]] == [2, 2]
    assert "FSDP2" in out
    # The exact statistics (equal to an unsharded copy's): tests/test_distributed_watch.py.


def test_rank_that_fails_is_named_and_the_finished_steps_are_kept(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK_FAULT", "raise:1:2")  # rank 1's make_batch raises at step 2
    report_path = tmp_path / "failed.json"
    code, _out, err = run(capsys, SCRIPT, "--nproc", "2", "--steps", "4", "--json", report_path)
    assert code == 2, err
    assert "gradscope: error: rank 1: " in err and "no data for step 2" in err
    assert "Traceback" not in err  # the user's frames, as one-process runs show them
    report = json.loads(report_path.read_text())
    assert report["error"]["rank"] == 1 and report["error"]["step"] == 2
    assert report["steps"] == [0, 1]  # rank 0's finished steps
    states = {rank["rank"]: rank["state"] for rank in report["ranks"]}
    assert states == {0: "stopped", 1: "failed"}


def test_rank_that_dies_without_a_word_is_named_not_the_rank_whose_peer_vanished(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("RANK_FAULT", "die:1:1")  # rank 1 is SIGKILLed in step 1's make_batch
    report_path = tmp_path / "died.json"
    code, _, err = run(capsys, SCRIPT, "--nproc", "2", "--steps", "3", "--json", report_path)
    assert code == 2, err
    assert "rank 1 died without reporting (killed by signal 9" in err
    report = json.loads(report_path.read_text())
    assert report["error"]["rank"] == 1 and report["error"]["step"] == 1
    # Rank 0's own error (its peer reset the connection) is the consequence, not the cause.
    assert {rank["rank"]: rank["state"] for rank in report["ranks"]} == {0: "stopped", 1: "died"}
    assert report["steps"] == [0]


def test_rank_that_hangs_is_ended_with_every_ranks_stacks(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK_FAULT", "hang:1:1")  # rank 1's forward sleeps at step 1
    report_path = tmp_path / "hung.json"
    started = time.monotonic()
    # 20 s: the ranks' start (imports, model, process group) counts as progress-free time
    # too, and on a loaded 2-core machine it took more than 8 s.
    code, _out, err = run(
        capsys,
        SCRIPT,
        "--nproc",
        "2",
        "--steps",
        "3",
        "--step-timeout",
        "20",
        "--json",
        report_path,
    )
    assert time.monotonic() - started < 90
    assert code == 2, err
    assert "no rank made progress for 20 s" in err
    assert "rank 1 is the one not waiting in torch" in err
    report = json.loads(report_path.read_text())
    assert report["error"]["rank"] == 1 and report["error"]["step"] == 1
    frames = "\n".join(report["error"]["traceback"])
    assert "rank 0 (step 1)" in frames and "(waiting inside torch)" in frames
    assert "rank_fault_model.py:" in frames and "in forward" in frames
    assert report["steps"] == [0]
    assert {rank["state"] for rank in report["ranks"]} == {"timed out"}


def test_fsdp_and_step_timeout_need_nproc(capsys):
    assert main(["run", str(SCRIPT), "--fsdp"]) == 2
    assert "--fsdp and --step-timeout go with --nproc N" in capsys.readouterr().err
    assert main(["run", str(SCRIPT), "--nproc", "0"]) == 2
    assert "--nproc must be >= 1" in capsys.readouterr().err


# -- per-rank recordings, read as a set ---------------------------------------------------
@pytest.fixture(scope="module")
def rank_recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks")
    record_rank_set(folder)
    return folder


@pytest.mark.parametrize("name", ["run.rank1.gsrec", "run.gsrec"])
def test_report_reads_the_rank_recordings_as_a_set(rank_recordings, tmp_path, capsys, name):
    report_path = tmp_path / "report.json"
    code = main(["report", str(rank_recordings / name), "--json", str(report_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(report_path.read_text())
    assert report["world_size"] == 2
    assert sorted(report["recordings"]) == ["0", "1"]
    assert report["steps"] == list(range(STEPS))
    rank0, rank1 = report["ranks"]
    assert [rank0["rank"], rank1["rank"]] == [0, 1]
    assert len(rank0["loss"]) == len(rank1["loss"]) == STEPS
    assert rank0["loss"] == report["loss"]  # the summary is rank 0's
    assert rank1["loss"][NAN_STEP] == "nan" and rank0["loss"][NAN_STEP] != "nan"
    assert report["first_nonfinite_rank"] == NAN_RANK
    # Rank 1's re-run located the NaN; rank 0's origin only points at another rank.
    assert report["first_nonfinite"]["rank"] == NAN_RANK
    assert report["first_nonfinite"]["phase"] != "unknown"
    assert rank0["first_nonfinite"] == {"step": NAN_STEP, "cause": "gradients"}
    assert "first rank to go non-finite: rank 1" in out
    assert "x 2 processes (rank 0's recording of 2)" in out


def test_a_leftover_rank_file_of_another_run_is_left_out(rank_recordings, tmp_path, capsys):
    from gradscope.core.recording.rank_set import find_rank_set

    for rank in (0, 1):
        shutil.copy(rank_recordings / f"run.rank{rank}.gsrec", tmp_path / f"run.rank{rank}.gsrec")
    # A rank 2 file next to them, as a former 3-process run with overwrite=True leaves it.
    shutil.copy(rank_recordings / "run.rank0.gsrec", tmp_path / "run.rank2.gsrec")
    found = find_rank_set(tmp_path / "run.gsrec")
    assert found is not None and sorted(found.paths) == [0, 1]
    assert found.primary.name == "run.rank0.gsrec"
    assert any("run.rank2.gsrec is left out" in note for note in found.notes)
    # Rank 1 alone: the set says rank 0 is missing and shows rank 1.
    (tmp_path / "run.rank0.gsrec").unlink()
    (tmp_path / "run.rank2.gsrec").unlink()
    found = find_rank_set(tmp_path / "run.rank1.gsrec")
    assert found is not None and found.primary_rank == 1
    assert any("rank(s) 0 of 2 is missing" in note for note in found.notes)
    # A one-process recording is no set.
    shutil.copy(rank_recordings / "run.rank1.gsrec", tmp_path / "single.gsrec")
    assert find_rank_set(tmp_path / "single.gsrec") is None


def test_ctrl_c_ends_the_ranks_and_keeps_the_finished_steps(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    report_path = tmp_path / "interrupted.json"
    command = [sys.executable, "-m", "gradscope", "run", str(SCRIPT), "--nproc", "2"]
    process = subprocess.Popen(
        [*command, "--steps", "100000", "--json", str(report_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, RANK_FAULT="none:-1:-1"),
    )
    time.sleep(8)  # the ranks are up and stepping (or still starting: also fine)
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 130, err
    report = json.loads(report_path.read_text())
    assert report["error"]["message"] == "interrupted (Ctrl+C)"
    assert report["world_size"] == 2 and len(report["ranks"]) == 2
    assert {rank["state"] for rank in report["ranks"]} == {"interrupted"}
    assert report["steps_run"] == len(report["ranks"][0]["steps"])
    assert "gradscope: interrupted" in err


def test_open_shows_the_named_rank_or_rank_0_of_the_set(rank_recordings, monkeypatch, capsys):
    import gradscope.cli as cli

    opened = []

    def launch(**kwargs):
        opened.append(kwargs["recording"])
        return 0

    monkeypatch.setattr(cli.app, "app_launcher", lambda: launch)
    assert main(["open", str(rank_recordings / "run.gsrec")]) == 0
    assert main(["open", str(rank_recordings / "run.rank1.gsrec")]) == 0
    assert opened == [
        str(rank_recordings / "run.rank0.gsrec"),
        str(rank_recordings / "run.rank1.gsrec"),
    ]
    assert "the set's other ranks: run.rank1.gsrec" in capsys.readouterr().err


@pytest.fixture
def one_rank_group():
    """A torch.distributed group of this process alone (gloo), gone after the test."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_fsdp_shards_each_child_that_owns_parameters_then_the_root(one_rank_group, monkeypatch):
    """The --fsdp wrapping and steps, without the watch (whose FSDP2 support is the watch's
    test): every module with parameters of its own, and the root, is a fully_shard unit; the
    optimizer steps the sharded (DTensor) parameters; a NaN in the batch stops the run."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from gradscope.core.distributed.worker import DistributedStepRunner
    from gradscope.core.sources import load_with_settings

    loaded, settings = load_with_settings(str(SCRIPT), {"device": "cpu", "steps": 3})
    runner = DistributedStepRunner(loaded, settings, rank=0, world_size=1, fsdp=True, watch=False)
    sharded = {
        name for name, module in runner.model.named_modules() if isinstance(module, FSDPModule)
    }
    assert sharded == {"", "body.0", "body.2", "head"}
    assert all(isinstance(p, DTensor) for p in runner.model.parameters())
    before = [p.detach().full_tensor().clone() for p in runner.model.parameters()]
    losses = [result.loss for result in runner.run()]
    assert len(losses) == 3 and all(loss == loss for loss in losses)
    after = [p.detach().full_tensor() for p in runner.model.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not runner.batch_nonfinite
    runner.close()
    monkeypatch.setenv("RANK_FAULT", "nan:0:1")
    loaded, settings = load_with_settings(str(SCRIPT), {"device": "cpu", "steps": 3})
    runner = DistributedStepRunner(loaded, settings, rank=0, world_size=1, fsdp=True, watch=False)
    assert [result.applied for result in runner.run()] == [True, False]
    assert runner.halted and runner.batch_nonfinite
    runner.close()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_ranks_end_when_the_launcher_is_killed(tmp_path):
    """``gradscope run`` killed outright (the out-of-memory killer, kill -9: no Ctrl+C to
    end the ranks) leaves no rank training on for nobody, nor torchrun."""
    import os
    import signal
    import subprocess
    import sys

    from gradscope.core.distributed import rank_stream
    from gradscope.core.distributed.processes import process_gone

    command = [sys.executable, "-m", "gradscope", "run", str(SCRIPT), "--nproc", "2"]
    process = subprocess.Popen(
        [*command, "--steps", "100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, RANK_FAULT="none:-1:-1", TMPDIR=str(tmp_path)),
    )
    pids: dict[int, int] = {}
    torchrun = None
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
            for folder in tmp_path.glob("gradscope-ranks-*"):
                for rank in (0, 1):
                    for kind, value in rank_stream.read_stream(
                        rank_stream.stream_path(folder, rank)
                    ):
                        if kind == rank_stream.START:
                            pids[rank] = value["pid"]
        assert len(pids) == 2, f"the ranks did not start (launcher exit {process.poll()})"
        stat = Path(f"/proc/{pids[0]}/stat").read_text()
        torchrun = int(stat.rsplit(")", 1)[1].split()[1])  # the rank's parent
        process.kill()
        process.wait(timeout=10)
        deadline = time.monotonic() + 20
        left = [*pids.values(), torchrun]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [pid for pid in left if not process_gone(pid)]
        assert not left, f"still running after the launcher was killed: {left}"
        # Its folder stays behind (the launcher's own cleanup never ran): the next launch
        # removes it once it has been left alone for a while.
        from gradscope.core.distributed.launcher import (
            ABANDONED_AFTER_S,
            sweep_abandoned_folders,
        )

        (abandoned,) = tmp_path.glob("gradscope-ranks-*")
        assert sweep_abandoned_folders(tmp_path) == []  # just left: kept for now
        old = time.time() - ABANDONED_AFTER_S - 1
        os.utime(abandoned, (old, old))
        assert sweep_abandoned_folders(tmp_path) == [abandoned]
        assert not abandoned.exists()
    finally:
        if process.poll() is None:
            process.kill()
        for pid in [*pids.values(), torchrun]:
            if pid and not process_gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_later_launch_keeps_the_folders_of_runs_still_going(tmp_path):
    """The sweep of abandoned run folders leaves alone a run whose launcher lives (however
    old its folder), and folders that are not a run's (no readable spec)."""
    import json
    import os
    import subprocess
    import sys

    from gradscope.core.distributed.launcher import ABANDONED_AFTER_S, sweep_abandoned_folders

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        going = tmp_path / "gradscope-ranks-going"
        stranger = tmp_path / "gradscope-ranks-stranger"
        for folder in (going, stranger):
            folder.mkdir()
        (going / "spec.json").write_text(json.dumps({"launcher_pid": alive.pid}))
        (stranger / "spec.json").write_text("not json")
        old = time.time() - ABANDONED_AFTER_S - 1
        for folder in (going, stranger):
            os.utime(folder, (old, old))
        assert sweep_abandoned_folders(tmp_path) == []
        assert going.exists() and stranger.exists()
        alive.kill()
        alive.wait()
        assert sweep_abandoned_folders(tmp_path) == [going]  # its launcher is gone now
        assert stranger.exists()
    finally:
        if alive.poll() is None:
            alive.kill()
            alive.wait()
