"""The CLI's side of ``gradscope run SCRIPT --nproc N``: start the ranks through
``torch.distributed.run`` (gloo on CPU, NCCL on CUDA, 127.0.0.1 and a free port), follow
their progress, and read back what each did.

No rank is waited for forever: when no rank has moved for ``step_timeout`` seconds (a step,
or building the model), every rank is asked for its stacks (SIGUSR1), then ended, and the
run's error names where each rank was. A rank that fails ends the others through the
launcher; its error is the run's, and the steps every rank finished are kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradscope.core.distributed import rank_stream
from gradscope.core.distributed.processes import process_gone
from gradscope.core.errors import GradScopeError
from gradscope.core.history import RunHistory
from gradscope.core.rank_facts import RankFacts, located_origin

DEFAULT_STEP_TIMEOUT = 300.0
FOLDER_PREFIX = "gradscope-ranks-"
# An abandoned run's folder is removed by a later launch only once it has been left alone
# this long (its ranks end within a second of their launcher).
ABANDONED_AFTER_S = 60.0


@dataclass
class DistributedRun:
    """What the ranks did. ``history`` is rank 0's steps (the statistics cover every rank:
    gradients are all-reduced, or reduced across shards), with the run's origin (the rank
    whose re-run located it); ``ranks`` each rank's facts; ``error`` the report's
    ``"error"`` (with ``"rank"``) and ``failure`` its kind: "bad input", "internal",
    "interrupted", "timed out", "died" (a rank ended without a word) or "launcher"."""

    world_size: int
    history: RunHistory = field(default_factory=RunHistory)
    ranks: list[RankFacts] = field(default_factory=list)
    device: str | None = None
    display_name: str | None = None
    source: str | None = None
    settings: dict[str, Any] | None = None
    trace: list[Any] = field(default_factory=list)
    error: dict[str, Any] | None = None
    failure: str | None = None
    halted: bool = False
    origin: Any = None  # the run's first origin (an Origin), from the rank that located it
    origin_rank: int | None = None
    outputs: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def check_request(settings: Any, nproc: int, fsdp: bool) -> None:
    """Refuse, before any process starts, what the ranks could not run."""
    import torch

    if nproc < 1:
        raise GradScopeError(f"--nproc must be >= 1, not {nproc}")
    if not torch.distributed.is_available():
        raise GradScopeError("--nproc needs torch.distributed, which this torch build lacks")
    device = settings.device
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        count = torch.cuda.device_count()
        if count == 0:
            raise GradScopeError(f"device {device!r} asked for, but CUDA is not available here")
        if device.startswith("cuda:"):
            raise GradScopeError(
                f"--device {device} names one GPU; with --nproc each rank takes its own "
                "(cuda:LOCAL_RANK): use --device cuda"
            )
        if nproc > count:
            raise GradScopeError(
                f"--nproc {nproc} on CUDA needs one GPU per process; {count} are visible "
                "(--device cpu runs the processes on the CPU, with gloo)"
            )
    if fsdp and settings.amp == "fp16":
        raise GradScopeError(
            "--amp fp16 with --fsdp is not supported yet (the loss scaler would need to agree "
            "on overflows across shards); use --amp bf16, or DDP (no --fsdp)"
        )


def launch(
    source: str,
    overrides: dict[str, Any],
    *,
    nproc: int,
    fsdp: bool = False,
    weights: str | None = None,
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
) -> DistributedRun:
    """Run the steps on ``nproc`` local processes and return what they did; whatever
    happens (a rank fails or hangs, Ctrl+C), the steps finished are in the result."""
    sweep_abandoned_folders(Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX) as name:
        folder = Path(name)
        spec = folder / "spec.json"
        spec.write_text(
            json.dumps(
                {
                    "source": source,
                    "overrides": overrides,
                    "weights": weights,
                    "fsdp": fsdp,
                    "step_timeout": step_timeout,
                    "folder": str(folder),
                    # each rank ends when this process is gone (see the worker)
                    "launcher_pid": os.getpid(),
                }
            ),
            encoding="utf-8",
        )
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "--max-restarts=0",
            "--monitor-interval=0.2",
            "-m",
            "gradscope.core.distributed.worker",
            str(spec),
        ]
        environment = dict(os.environ)
        # torchrun's own default for several processes, set here so it prints no banner.
        environment.setdefault("OMP_NUM_THREADS", "1")
        log_path = folder / "launcher.log"
        with open(log_path, "wb") as log:
            # A session of its own: Ctrl+C reaches this process only, which ends the ranks.
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
                start_new_session=True,
            )
            timed_out = interrupted = False
            try:
                timed_out = _follow(process, folder, nproc, step_timeout)
            except KeyboardInterrupt:
                interrupted = True
                _end_ranks(process, folder, nproc, signal.SIGTERM)
        log_text = log_path.read_text(encoding="utf-8", errors="replace")
        return _collect(
            folder,
            nproc,
            step_timeout=step_timeout,
            timed_out=timed_out,
            interrupted=interrupted,
            launcher_code=process.returncode,
            log_text=log_text,
        )


def sweep_abandoned_folders(temporary: Path) -> list[Path]:
    """Remove the folders of runs whose launcher was killed (kill -9, the out-of-memory
    killer: its own cleanup never ran), as the next launch begins: a folder whose spec
    names a launcher that is gone, untouched for ABANDONED_AFTER_S. A run still going, or
    one whose launcher's pid is another live process now, keeps its folder. The removed."""
    removed = []
    now = time.time()
    for folder in temporary.glob(FOLDER_PREFIX + "*"):
        try:
            facts = folder.stat()
            if now - facts.st_mtime < ABANDONED_AFTER_S or not folder.is_dir():
                continue
            if hasattr(os, "getuid") and facts.st_uid != os.getuid():
                continue  # another user's run
            spec = json.loads((folder / "spec.json").read_text(encoding="utf-8"))
            pid = int(spec["launcher_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not one of ours, or not readable: left alone
        if pid != os.getpid() and process_gone(pid):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
    return removed


def _progress(folder: Path, nproc: int) -> int:
    total = 0
    for rank in range(nproc):
        try:
            total += rank_stream.stream_path(folder, rank).stat().st_size
        except FileNotFoundError:
            pass
    return total


def _follow(process: subprocess.Popen, folder: Path, nproc: int, step_timeout: float) -> bool:
    """Wait for the launcher; True when the ranks stopped moving and were ended."""
    last_size, last_move = -1, time.monotonic()
    while True:
        try:
            process.wait(timeout=0.2)
            return False
        except subprocess.TimeoutExpired:
            pass
        size, now = _progress(folder, nproc), time.monotonic()
        if size != last_size:
            last_size, last_move = size, now
        elif now - last_move > step_timeout:
            pids = _pids(folder, nproc)
            for pid in pids.values():
                _signal(pid, signal.SIGUSR1)
            _wait_for_stacks(folder, pids, 5.0)
            _end_ranks(process, folder, nproc, signal.SIGKILL)
            return True


def _pids(folder: Path, nproc: int) -> dict[int, int]:
    found = {}
    for rank in range(nproc):
        for kind, payload in rank_stream.read_stream(rank_stream.stream_path(folder, rank)):
            if kind == rank_stream.START:
                found[rank] = int(payload["pid"])
                break
    return found


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_for_stacks(folder: Path, pids: dict[int, int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(
            _size(rank_stream.stacks_path(folder, rank)) > 0 or process_gone(pid)
            for rank, pid in pids.items()
        ):
            time.sleep(0.2)  # the dump is written in pieces
            return
        time.sleep(0.1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _end_ranks(process: subprocess.Popen, folder: Path, nproc: int, number: int) -> None:
    """End every rank, then the launcher (which has nothing left to wait for)."""
    for pid in _pids(folder, nproc).values():
        _signal(pid, number)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- reading back ------------------------------------------------------------------------
@dataclass
class _Rank:
    rank: int
    pid: int | None = None
    built: dict[str, Any] | None = None
    started: int | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None


def _read_rank(folder: Path, rank: int) -> _Rank:
    found = _Rank(rank)
    for kind, payload in rank_stream.read_stream(rank_stream.stream_path(folder, rank)):
        if kind == rank_stream.START:
            found.pid = payload["pid"]
        elif kind == rank_stream.BUILT:
            found.built = payload
        elif kind == rank_stream.STEP_STARTED:
            found.started = int(payload)
        elif kind == rank_stream.STEP:
            found.steps.append(payload)
        elif kind == rank_stream.END:
            found.end = payload
    return found


def _collect(
    folder: Path,
    nproc: int,
    *,
    step_timeout: float,
    timed_out: bool,
    interrupted: bool,
    launcher_code: int | None,
    log_text: str,
) -> DistributedRun:
    run = DistributedRun(world_size=nproc)
    ranks = [_read_rank(folder, rank) for rank in range(nproc)]
    for each in ranks:
        text = _read_text(rank_stream.output_path(folder, each.rank))
        if text.strip():
            run.outputs[each.rank] = text
    for each in ranks:
        facts = RankFacts(each.rank)
        for step in each.steps:
            stats = step["stats"]
            facts.note_step(
                step["step"],
                step["loss"],
                statistics_nonfinite=bool(stats.nonfinite) if stats is not None else False,
                batch_nonfinite=bool(step["batch_nonfinite"]),
                origin=step["origin"],
            )
        facts.state = _state(each, timed_out=timed_out, interrupted=interrupted)
        if each.end is not None and each.end["error"] is not None:
            facts.error = _report_error(each.end["error"], each.rank)
        run.ranks.append(facts)
    chosen = located_origin(run.ranks)
    if chosen is not None:
        run.origin_rank, run.origin = chosen
    _fill_history(run, ranks, chosen[1] if chosen is not None else None)
    stacks = {each.rank: _read_text(rank_stream.stacks_path(folder, each.rank)) for each in ranks}
    _settle_error(run, ranks, stacks, step_timeout, timed_out, interrupted, launcher_code, log_text)
    return run


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _state(each: _Rank, *, timed_out: bool, interrupted: bool) -> str:
    if each.end is not None:
        error = each.end["error"]
        if error is None:
            return "finished"
        return "interrupted" if error["kind"] == "interrupted" else "failed"
    if interrupted:
        return "interrupted"
    if timed_out:
        return "timed out"
    if each.pid is None:
        return "not started"
    return "stopped"


def _report_error(error: dict[str, Any], rank: int) -> dict[str, Any]:
    return {
        "step": error["step"],
        "message": error["message"],
        "traceback": list(error["traceback"]),
        "rank": rank,
    }


def _fill_history(run: DistributedRun, ranks: list[_Rank], origin: Any) -> None:
    """Rank 0's steps (or the lowest rank that built the model), as one-process runs fill
    theirs, with the run's origin at its step."""
    primary = next((each for each in ranks if each.built is not None), None)
    if primary is None:
        return
    built = primary.built
    assert built is not None
    run.device, run.display_name = built["device"], built["display_name"]
    run.source, run.settings = built["source"], built["settings"]
    names = [name for name, _, _ in built["layers"]]
    types = [type_name for _, type_name, _ in built["layers"]]
    params = [count for _, _, count in built["layers"]]
    run.history.ensure_layers(names, types, params)
    for step in primary.steps:
        own = step["origin"]
        if origin is not None and step["step"] == origin.step:
            own = origin
        run.history.append(step["step"], step["loss"], step["stats"], names, types, params, own)
        run.trace.extend(step["trace"] or ())
    run.halted = bool(primary.end is not None and primary.end.get("halted"))


def _settle_error(
    run: DistributedRun,
    ranks: list[_Rank],
    stacks: dict[int, str],
    step_timeout: float,
    timed_out: bool,
    interrupted: bool,
    launcher_code: int | None,
    log_text: str,
) -> None:
    if not (timed_out or interrupted) and _blame_the_dead(run, ranks, log_text):
        return
    failed = [
        each
        for each in ranks
        if each.end is not None
        and each.end["error"] is not None
        and each.end["error"]["kind"] != "interrupted"
    ]
    if failed:
        first = min(failed, key=lambda each: each.end["error"]["time"])  # type: ignore[index]
        error = first.end["error"]  # type: ignore[index]
        same = [each.rank for each in failed if each.end["error"]["message"] == error["message"]]  # type: ignore[index]
        who = _ranks_words(same, len(ranks))
        run.error = _report_error(error, first.rank)
        run.error["message"] = f"{who}: {error['message']}"
        run.failure = error["kind"]
        for facts in run.ranks:
            if facts.state == "failed" and facts.rank not in same:
                # Its own error came after the first failure (a collective whose peer is
                # gone): it was stopped by that failure; its error stays in its entry.
                facts.state = "stopped"
        return
    if timed_out:
        lines, stuck = _stack_summary(ranks, stacks)
        where = f"; rank {stuck} is the one not waiting in torch" if stuck is not None else ""
        step = max((each.started for each in ranks if each.started is not None), default=None)
        run.error = {
            "step": step,
            "message": f"no rank made progress for {step_timeout:g} s (--step-timeout); "
            f"every rank was ended{where}",
            "traceback": lines,
            "rank": stuck,
        }
        run.failure = "timed out"
        return
    if interrupted:
        step = max((each.started for each in ranks if each.started is not None), default=None)
        run.error = {"step": step, "message": "interrupted (Ctrl+C)", "traceback": []}
        run.failure = "interrupted"
        return
    silent = [each for each in ranks if each.end is None]
    if not silent and launcher_code:
        # Every rank reported its end: the run is whole; the launcher's own trouble after
        # that is worth a note, not a failure.
        run.notes.append(
            f"torch.distributed.run exited with {launcher_code} after every rank ended"
        )
        return
    if silent:
        tail = [line for line in log_text.splitlines() if line.strip()][-40:]
        if silent and all(each.pid is None for each in ranks):
            message = f"torch.distributed.run could not start the ranks (exit {launcher_code})"
        else:
            ended = [each.rank for each in silent if each.pid is not None]
            message = (
                f"{_ranks_words(ended, len(ranks))} ended without reporting (killed, or "
                f"crashed in native code); the launcher exited with {launcher_code}"
            )
        step = max((each.started for each in silent if each.started is not None), default=None)
        run.error = {"step": step, "message": message, "traceback": tail}
        run.failure = "launcher"


def _blame_the_dead(run: DistributedRun, ranks: list[_Rank], log_text: str) -> bool:
    """A rank that died without a word (SIGKILL from the out-of-memory killer, a crash in
    native code) is the run's failure: the errors the others then reported (a peer that
    reset the connection) are its consequence. The launcher ends the others with SIGTERM, so
    a silent rank with another exit code died by itself."""
    codes = _exit_codes(log_text)
    dead = [
        each
        for each in ranks
        if each.end is None
        and each.pid is not None
        and codes.get(each.rank) not in (None, -signal.SIGTERM)
    ]
    if not dead:
        return False
    first = dead[0]
    code = codes[first.rank]
    how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    if code == -signal.SIGKILL:
        how += ", as the out-of-memory killer does"
    run.error = {
        "step": first.started,
        "message": f"{_ranks_words([each.rank for each in dead], len(ranks))} died without "
        f"reporting ({how}); the other ranks were ended",
        "traceback": [],
        "rank": first.rank,
    }
    run.failure = "died"
    dead_ranks = {each.rank for each in dead}
    for facts in run.ranks:
        facts.state = "died" if facts.rank in dead_ranks else "stopped"
    return True


_EXIT = re.compile(
    r"rank\s*:\s*(?P<rank>\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)"
)


def _exit_codes(log_text: str) -> dict[int, int]:
    """Each failed rank's exit code (negative: the signal), from torch.distributed.run's own
    failure summary."""
    return {int(found["rank"]): int(found["code"]) for found in _EXIT.finditer(log_text)}


def _ranks_words(ranks: list[int], world: int) -> str:
    if len(ranks) == world and world > 1:
        return "every rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')


def _main_thread(text: str) -> list[tuple[str, int, str]]:
    """The frames (innermost first) of the thread running the rank's steps, from a
    faulthandler dump: the one inside the worker's ``main`` (not its launcher watch)."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
            continue
        found = _FRAME.match(line)
        if found and threads:
            threads[-1].append((found["file"], int(found["line"]), found["function"]))
    for frames in threads:
        if any(
            file.endswith(os.path.join("distributed", "worker.py")) and function == "main"
            for file, _, function in frames
        ):
            return frames
    return threads[-1] if threads else []


def _torch_dir() -> str:
    import torch

    return os.path.dirname(torch.__file__) + os.sep


def _stack_summary(ranks: list[_Rank], stacks: dict[int, str]) -> tuple[list[str], int | None]:
    """Per rank: its step and where its main thread was, and its frames; and the one rank
    whose innermost frame is outside torch (the others wait in a collective), if one."""
    torch_dir = _torch_dir()
    lines: list[str] = []
    outside = []
    for each in ranks:
        frames = _main_thread(stacks.get(each.rank, ""))
        at = f"step {each.started}" if each.started is not None else "before step 0"
        if not frames:
            lines.append(f"rank {each.rank} ({at}): no stacks (the process did not answer)")
            continue
        file, line, function = frames[0]
        in_torch = file.startswith(torch_dir)
        if not in_torch:
            outside.append(each.rank)
        waiting = " (waiting inside torch)" if in_torch else ""
        lines.append(f"rank {each.rank} ({at}): at {file}:{line} in {function}{waiting}")
        lines.extend(f"    {f}:{n} in {fn}" for f, n, fn in frames)
    return lines, outside[0] if len(outside) == 1 else None
