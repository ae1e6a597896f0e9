"""One rank of ``gradscope run SCRIPT --nproc N``, started by ``torch.distributed.run``.

``python -m gradscope.core.distributed.worker SPEC.json`` (torchrun sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT). The rank loads the script, builds the model with
the run's seed (the same weights on every rank), wraps it in DDP or shards it with
``fully_shard``, then draws its batches from its own random stream (rank r > 0 reseeds with
``seed + r`` after the build; rank 0 keeps the stream a one-process run has) and runs the usual
steps. Each step goes to the launcher through :mod:`.rank_stream`; the rank's own output goes
to a file the launcher shows. SIGUSR1 dumps every thread's stack (the launcher asks for them
when the ranks stop moving), and a backstop ends the process by itself should a step hang with
the launcher gone. A rank whose launcher is gone (killed by the out-of-memory killer or by
hand: nobody reads its steps any more) ends within a second or so, and torchrun with it,
instead of training on and holding its device.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from gradscope.core.distributed import rank_stream
from gradscope.core.distributed.processes import process_gone
from gradscope.core.errors import GradScopeError
from gradscope.core.loading import LoadedModel
from gradscope.core.runner import StepResult, StepRunner, _tensors_in, resolve_device
from gradscope.core.settings import RunSettings
from gradscope.core.sources import load_with_settings


def owns_parameters(module: nn.Module) -> bool:
    return next(module.parameters(recurse=False), None) is not None


class DistributedStepRunner(StepRunner):
    """The usual steps on one rank: the model in DDP (or sharded with ``fully_shard``, per
    child module that owns parameters and then the root), the batch's finiteness noted (which
    rank's data broke), and the ranks agreeing to stop at a non-finite step (one 1-element
    all-reduce per step: a rank that stopped alone would leave the others waiting in the next
    collective)."""

    def __init__(
        self,
        loaded: LoadedModel,
        settings: RunSettings,
        *,
        rank: int,
        world_size: int,
        fsdp: bool,
        watch: bool = True,
    ) -> None:
        self.rank, self.world_size, self.fsdp = rank, world_size, fsdp
        self.batch_nonfinite = False
        super().__init__(loaded, settings, watch=watch)
        if rank:
            torch.manual_seed(self.settings.seed + rank)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        if not any(p.requires_grad for p in model.parameters()):
            return model  # the optimizer says "no trainable parameters"
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard

            # Bottom-up: each child that owns parameters is its own unit, the root last.
            for _, module in reversed(list(model.named_modules())):
                if module is not model and owns_parameters(module):
                    fully_shard(module)
            fully_shard(model)
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    def _batch(self) -> tuple[Any, Any]:
        inputs, target = super()._batch()
        checks = [
            torch.isfinite(t).all()
            for t in _tensors_in((inputs, target))
            if t.is_floating_point() or t.is_complex()
        ]
        self.batch_nonfinite = bool(checks) and not bool(torch.stack(checks).all())
        return inputs, target

    def apply(self, result: StepResult) -> StepResult:
        flag = torch.tensor([1.0 if result.nonfinite else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and not result.nonfinite and not self.settings.keep_going:
            # Another rank's step went non-finite and it stops there: so does this one.
            self._computed = None
            self.halted = True
            self.step_index += 1
            return result
        return super().apply(result)


def _error(kind: str, step: int | None, message: str, lines: list[str]) -> dict[str, Any]:
    return {"kind": kind, "step": step, "message": message, "traceback": lines, "time": time.time()}


def main(argv: list[str]) -> NoReturn:
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    folder = Path(spec["folder"])
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    step_timeout = float(spec["step_timeout"])
    # The rank's own output (the user's prints, warnings) goes to its file: the launcher's
    # stdout is the summary table.
    output = open(rank_stream.output_path(folder, rank), "ab", buffering=0)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
    stacks = open(rank_stream.stacks_path(folder, rank), "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    backstop = 2 * step_timeout + 60
    faulthandler.dump_traceback_later(backstop, exit=True, file=stacks)
    end_with_launcher(spec.get("launcher_pid"))
    stream = rank_stream.RankStreamWriter(rank_stream.stream_path(folder, rank))
    stream.write(rank_stream.START, {"rank": rank, "world_size": world, "pid": os.getpid()})
    runner: DistributedStepRunner | None = None
    error = None
    try:
        loaded, settings = load_with_settings(
            spec["source"], spec["overrides"], weights=spec.get("weights")
        )
        device = resolve_device(settings.device)
        if device.type == "cuda":
            settings = settings.replaced(device=f"cuda:{local_rank}")
            torch.cuda.set_device(local_rank)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=step_timeout + 60),
        )
        runner = DistributedStepRunner(
            loaded, settings, rank=rank, world_size=world, fsdp=bool(spec["fsdp"])
        )
        watch = runner.watch
        layers = [] if watch is None else watch.layers
        stream.write(
            rank_stream.BUILT,
            {
                "device": str(runner.device),
                "display_name": loaded.display_name,
                "source": loaded.source,
                "settings": runner.settings.to_dict(),
                "layers": [(x.name, x.type_name, x.num_params) for x in layers],
            },
        )
        for _ in range(runner.settings.steps):
            faulthandler.dump_traceback_later(backstop, exit=True, file=stacks)
            stream.write(rank_stream.STEP_STARTED, runner.step_index)
            result = runner.step()
            stream.write(
                rank_stream.STEP,
                {
                    "step": result.step,
                    "loss": result.loss,
                    "stats": result.stats,
                    "origin": result.origin,
                    "trace": result.trace,
                    "batch_nonfinite": runner.batch_nonfinite,
                    "applied": result.applied,
                },
            )
            if runner.halted:
                break
    except KeyboardInterrupt:
        error = _error("interrupted", _step(runner), "interrupted", [])
    except GradScopeError as raised:
        error = _error("bad input", _step(runner), raised.message, raised.details)
    except (Exception, SystemExit) as raised:
        text = "".join(traceback.format_exception(type(raised), raised, raised.__traceback__))
        message = f"{type(raised).__name__}: {raised}"
        error = _error("internal", _step(runner), message, text.rstrip("\n").splitlines())
    try:
        if runner is not None:
            runner.close()
    except Exception as raised:  # the steps are handed over; closing must not lose them
        print(f"gradscope: closing the run failed: {raised!r}", file=sys.stderr)
    stream.write(
        rank_stream.END,
        {"error": error, "halted": bool(runner is not None and runner.halted)},
    )
    stream.close()
    sys.stdout.flush()
    sys.stderr.flush()
    if error is not None:
        # At once: a clean shutdown could wait on ranks that are still in a collective; the
        # launcher sees the failure and ends the others.
        leave(1)
    dist.destroy_process_group()
    leave(0)


LAUNCHER_CHECK_S = 0.5


def end_with_launcher(pid: int | None, every: float = LAUNCHER_CHECK_S) -> None:
    """Watch the launcher (``gradscope run``) from a daemon thread and end this rank at once
    when it is gone. Its steps go to a folder nobody reads then; torchrun, which started
    the rank in a session of its own, ends when its ranks do."""
    if not pid:
        return

    def watch() -> None:
        while not process_gone(pid):
            time.sleep(every)
        print(f"gradscope: the launcher (pid {pid}) is gone; this rank ends", file=sys.stderr)
        leave(1)

    threading.Thread(target=watch, name="gradscope-launcher-watch", daemon=True).start()


def leave(code: int) -> NoReturn:
    """Ends a rank's process now, its output flushed, without Python's shutdown: for a rank
    whose work is written. A gloo worker thread can still be releasing the last collective's
    work (here the step's stop flag) as the interpreter finalizes; when that work holds a
    tensor whose Python object torch keeps alive, the release needs the GIL, the thread is
    ended mid-unwind and the rank aborts with "terminate called without an active exception"
    (SIGABRT) after a whole run (pytorch/pytorch#179291; about once in 35 runs of the
    benchmark's FSDP case on 2 cores). Test and benchmark ranks end through it too."""
    faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _step(runner: StepRunner | None) -> int | None:
    return None if runner is None else int(runner.step_index)


if __name__ == "__main__":
    main(sys.argv[1:])
