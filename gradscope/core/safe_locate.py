"""The diagnosis re-run, made safe to run inside anybody's training loop.

:func:`gradscope.core.origin.locate_first_nonfinite` re-runs a failing step with instruments.
Inside a user's week-long job that re-run must never be what kills or hangs the run, so
:func:`locate_safely` wraps it:

- it never raises (except KeyboardInterrupt and SystemExit): an error in the re-run, a re-run
  that stays finite, or one that runs out of time gives an origin of phase ``"unknown"``
  whose ``details["reason"]`` says what happened and what to do;
- it runs no collective: calls of a DDP wrapper go to the model inside it (no buffer
  broadcast, no gradient all-reduce), and models whose forward needs other ranks (FSDP,
  SyncBatchNorm) are not re-run at all;
- compiled models are re-run eagerly (``_orig_mod``), so dynamo neither recompiles nor warns;
- it is bounded in time: every torch operation of the re-run checks a deadline, and the
  re-run runs in the caller's thread, so nothing of it touches the model after it returns;
- it is invisible: :mod:`gradscope.core.invisible_rerun` puts back the random generators
  (the user's next dropout mask is the one it would have been), the gradients, buffers and
  weights, and the modules' plain Python attributes (a call counter in ``forward``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from gradscope.core.facts import STATUS_NONFINITE, Origin, StepStats
from gradscope.core.invisible_rerun import InvisibleRerun
from gradscope.core.origin.traced_step import locate_first_nonfinite, origin_from_statistics
from gradscope.core.trace import trace_step
from gradscope.core.wrappers import running_locally, sharded_reason, unwrap_model

DEFAULT_TIMEOUT = 120.0
# Events of the failing step kept with its origin (forward + backward of every module; a
# model of thousands of modules keeps the first ones, in execution order).
MAX_TRACE_EVENTS = 5000


class LocateTimeout(Exception):
    """The re-run went past its deadline."""


class _Deadline(TorchFunctionMode):
    """Checks the clock at every torch operation of the re-run's forward and loss. It stops
    the re-run once: the operations after that are the re-run's own restore (buffers,
    weights, gradients), which must run to its end."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.fired = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.fired and time.monotonic() > self.deadline:
            self.fired = True
            raise LocateTimeout(f"the re-run took longer than {self.seconds:g} s")
        return func(*args, **(kwargs or {}))


def _distributed_world() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def unknown_origin(stats: StepStats, reason: str, **details: Any) -> Origin:
    """An origin that says it was not located, why, and what the statistics alone show."""
    statistical = origin_from_statistics(stats)
    origin = Origin(
        stats.step,
        "unknown",
        None,
        statistical.tensor,
        statistical.kind,
        details={"reason": reason, "statistics_phase": statistical.phase, **details},
    )
    return origin


def locate_safely(
    model: nn.Module,
    locate: Callable[[], Any],
    stats: StepStats,
    layer_names: list[str],
    *,
    batch: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
    repeated: bool = False,
) -> Origin:
    """Re-run the failing step through ``locate`` (a function that rebuilds the step's loss
    from the same batch) and return where its first NaN/Inf came from. Never raises for
    GradScope's own reasons; see the module docstring. ``repeated``: ``locate`` is the
    watch's own repeat of a captured step (:mod:`gradscope.core.replay`), not the user's;
    the reasons then say so."""
    reason = sharded_reason(model)
    if reason is not None:
        return unknown_origin(stats, reason)
    eager = unwrap_model(model)
    # the model's tensors are put back by the traced step itself, around its forward and
    # backward (locate_first_nonfinite promises that to its own callers too)
    rerun = InvisibleRerun(eager, model_tensors=False)
    started = time.monotonic()
    try:
        with running_locally(model), _Deadline(timeout), torch.enable_grad():
            with trace_step(eager, stats.step, summaries=True) as trace:
                found = locate_first_nonfinite(
                    eager, rerun.watching(locate), stats.step, batch=batch
                )
    except LocateTimeout as error:
        return unknown_origin(
            stats,
            f"{error}; the step was not located (raise locate_timeout to wait longer)",
        )
    except Exception as error:  # the user's locate(), or the instruments, failed
        first_line = (str(error).splitlines() or [""])[0]
        advice = (
            "pass locate=<a function recomputing the loss from the same batch> to collect()"
            if repeated
            else "check that locate() rebuilds this step's loss from the same batch"
        )
        return unknown_origin(
            stats,
            f"the re-run raised {type(error).__name__}: {first_line}. Training goes on; " + advice,
            error=f"{type(error).__name__}: {first_line}",
        )
    finally:
        changed = rerun.restore()
    seconds = time.monotonic() - started
    if found is None:
        if _distributed_world() > 1:
            reason = (
                "this rank's re-run was finite: the NaN/Inf most likely came from another "
                "rank's batch through the gradient all-reduce (see that rank's origin)"
            )
        else:
            if repeated:
                reason = (
                    "the repeat of this step's forward and backward was finite: the inputs may "
                    "have been changed in place after the forward, a non-deterministic kernel "
                    "can make a NaN that does not repeat, or the step's loss is not the model's "
                    "output (pass locate=<a function recomputing the loss> to collect())"
                )
            else:
                reason = (
                    "the re-run of this step was finite: locate() must rebuild this step's "
                    "loss exactly (the same batch, autocast, loss scaling and micro-batches); "
                    "a non-deterministic kernel can also make a NaN that does not repeat"
                )
            if changed:
                reason += (
                    f". The forward also changes Python state on the model ({changed}; put "
                    "back after the re-run): a forward that counts its calls or keeps state "
                    "between them can take another path when it is repeated"
                )
        return unknown_origin(
            stats, reason, finite=True, nonfinite_layers=_nonfinite_layers(stats, layer_names)
        )
    found.details.setdefault("locate_seconds", round(seconds, 3))
    if trace.events:
        # the failing step, walkable module by module wherever the origin goes (recording,
        # report, app)
        events = [event.to_json() for event in trace.events[:MAX_TRACE_EVENTS]]
        found.details["trace"] = events
        if len(trace.events) > MAX_TRACE_EVENTS:
            found.details["trace_events_dropped"] = len(trace.events) - MAX_TRACE_EVENTS
    return found


def _nonfinite_layers(stats: StepStats, layer_names: list[str]) -> list[str]:
    return [layer_names[i] for i in np.flatnonzero(stats.status == STATUS_NONFINITE).tolist()]


def statistics_origin(stats: StepStats, layer_names: list[str]) -> Origin:
    """What the statistics alone say, for a watch given no ``locate``: weights that were
    already non-finite (the first such layer), the loss, or the layers whose gradients went
    non-finite (the last registered one is the likeliest to have gone first, since gradients
    flow from the last layer to the first)."""
    hint = (
        "found from the statistics alone; pass locate=<a function recomputing the loss from "
        "the same batch> to collect() to find the operation and line"
    )
    if stats.weight_norm is not None:
        # The weights are read after the backward, before the optimizer step: weights that
        # are not finite then were so in this step's forward already.
        broken = np.flatnonzero(~np.isfinite(stats.weight_norm)).tolist()
        if broken:
            names = [layer_names[i] for i in broken]
            nan = bool(np.isnan(stats.weight_norm[broken]).any())
            details = {"reproduced": False, "nonfinite_weights": names, "hint": hint}
            return Origin(
                stats.step, "update", names[0], "weight", "nan" if nan else "inf", details=details
            )
    origin = origin_from_statistics(stats, {"hint": hint})
    if origin.phase == "backward":
        bad = _nonfinite_layers(stats, layer_names)
        origin.details["nonfinite_layers"] = bad
        origin.module = bad[-1] if bad else None
    return origin
