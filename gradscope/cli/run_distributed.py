"""``gradscope run SOURCE --nproc N [--fsdp]``: the ranks under torch.distributed.run, told
from this process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gradscope.cli.exits import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NONFINITE,
    EXIT_OK,
    REPORT_BUG,
    stopped_by,
)
from gradscope.cli.options import typed_overrides
from gradscope.cli.output import check_output_path, say
from gradscope.cli.run_output import print_origin, say_run_header, write_run_report
from gradscope.core.errors import GradScopeError

_FAILURE_CODES = {
    "bad input": EXIT_BAD_INPUT,
    "timed out": EXIT_BAD_INPUT,
    "died": EXIT_BAD_INPUT,  # most often the out-of-memory killer
    "internal": EXIT_INTERNAL,
    "launcher": EXIT_INTERNAL,
    "interrupted": EXIT_INTERRUPTED,
}


_FAILURE_OF_CODE = {
    EXIT_INTERRUPTED: "interrupted",
    EXIT_BAD_INPUT: "bad input",
    EXIT_INTERNAL: "internal",
}


def run_distributed(args: argparse.Namespace) -> int:
    """``gradscope run SOURCE --nproc N [--fsdp]``: the ranks run under torch.distributed.run;
    this process prints rank 0's summary, each rank's losses and which rank went non-finite
    first, and writes the JSON (``"world_size": N``, ``"ranks"``). A rank that fails or stops
    moving ends the run with its error (and stacks); the finished steps are kept."""
    from gradscope.core.distributed.launcher import (
        DEFAULT_STEP_TIMEOUT,
        DistributedRun,
        check_request,
        launch,
    )
    from gradscope.core.rank_facts import rank_lines, ranks_json
    from gradscope.core.report import origin_to_json
    from gradscope.core.sources import load_with_settings

    if args.json:
        check_output_path(args.json, "--json")
    step_timeout = DEFAULT_STEP_TIMEOUT if args.step_timeout is None else args.step_timeout
    if not step_timeout > 0:
        raise GradScopeError(f"--step-timeout must be > 0, not {args.step_timeout}")
    try:
        # The script is loaded here first: a bad script, setting or request is one message
        # before any process starts.
        overrides = typed_overrides(args)
        _, settings = load_with_settings(args.source, overrides, weights=args.weights)
        check_request(settings, args.nproc, args.fsdp)
        run = launch(
            args.source,
            overrides,
            nproc=args.nproc,
            fsdp=args.fsdp,
            weights=args.weights,
            step_timeout=step_timeout,
        )
    except SystemExit:
        raise
    except BaseException as raised:
        user_files = [Path(args.source)] if args.source.endswith(".py") else []
        stopped, _, error = stopped_by(raised, None, user_files)
        run = DistributedRun(args.nproc, failure=_FAILURE_OF_CODE[stopped])
        if stopped == EXIT_INTERNAL:  # worded as a rank's internal error is (printed below)
            error["message"] = f"{type(raised).__name__}: {raised}"
        run.error = error
    for rank, text in sorted(run.outputs.items()):
        for line in text.rstrip("\n").splitlines():
            print(f"[rank {rank}] {line}", file=sys.stderr)
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    history = run.history
    code = _FAILURE_CODES.get(run.failure or "", EXIT_OK)
    if args.json:
        extra = {}
        if run.origin is not None:  # also when rank 0 stopped before that step
            extra["first_nonfinite"] = {**origin_to_json(run.origin), "rank": run.origin_rank}
        extra.update(ranks_json(run.ranks))
        written = write_run_report(
            args.json,
            source=run.source or args.source,
            device=run.device,
            history=history,
            settings=run.settings,
            world_size=run.world_size,
            trace=run.trace,
            error=run.error,
            extra=extra,
        )
        if not written and code != EXIT_INTERRUPTED:
            code = max(code, EXIT_BAD_INPUT)
    if run.display_name is not None:
        engine = "FSDP2" if args.fsdp else "DDP"
        backend = "nccl" if (run.device or "").startswith("cuda") else "gloo"
        title = (
            f"{run.display_name} on {run.device} x {run.world_size} processes ({engine}, {backend})"
        )
        say_run_header(title, history, loss_of="rank 0 ")
    for line in rank_lines(run.ranks):
        say(line)
    origin = run.origin
    if origin is not None:
        print_origin(origin, halted=run.halted, rank=run.origin_rank)
    if run.error is not None:
        if run.failure == "interrupted":
            print("gradscope: interrupted", file=sys.stderr)
        else:
            prefix = "internal error: " if run.failure == "internal" else ""
            print(f"gradscope: error: {prefix}{run.error['message']}", file=sys.stderr)
            if run.failure == "internal":
                print(f"gradscope: {REPORT_BUG}", file=sys.stderr)
            for line in run.error["traceback"]:
                print(f"  {line}", file=sys.stderr)
        if history.count:
            print(
                f"gradscope: the summary{' and --json hold' if args.json else ' holds'} the "
                f"{history.count} step(s) rank 0 finished",
                file=sys.stderr,
            )
    nonfinite = origin is not None or any(facts.nonfinite for facts in run.ranks)
    if code == EXIT_OK and nonfinite and args.fail_on_nonfinite:
        return EXIT_NONFINITE
    return code
