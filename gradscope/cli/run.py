"""``gradscope run SOURCE ...``: train headless for a few steps and print a per-layer
summary (``--nproc N``: see ``run_distributed``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from gradscope.cli.exits import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_NONFINITE,
    EXIT_OK,
    print_error,
    print_internal_error,
    stopped_by,
)
from gradscope.cli.options import add_run_options, typed_overrides
from gradscope.cli.output import Progress, check_output_path
from gradscope.cli.run_distributed import run_distributed
from gradscope.cli.run_output import (
    print_origin,
    say_early_warnings,
    say_run_header,
    write_run_report,
)
from gradscope.core.errors import GradScopeError


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope run",
        description="Train a model for a few steps headless and report per-layer gradients.",
    )
    parser.add_argument("source", help="a .py model script or a torchvision model name")
    add_run_options(parser)
    parser.add_argument("--json", metavar="PATH", help="write the report as strict JSON")
    parser.add_argument(
        "--fail-on-nonfinite",
        action="store_true",
        help="exit with status 1 when a NaN/Inf was found",
    )
    parser.add_argument(
        "--fail-on-warning",
        action="store_true",
        help="exit with status 1 when an early warning was given (turns --early-warnings on)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="train on N local processes through torch.distributed.run (DDP; gloo on CPU, "
        "NCCL on CUDA with one GPU per process), each on its own batches",
    )
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="with --nproc: shard the model with FSDP2 (fully_shard) instead of DDP",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        metavar="SECONDS",
        help="with --nproc: end the run, with every rank's stacks, when no rank has moved "
        "for this long (default 300)",
    )
    return parser


def run_command(argv: Sequence[str]) -> int:
    args = _run_parser().parse_args(list(argv))
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.fail_on_warning:
        args.early_warnings = True
    if args.nproc is not None:
        if args.early_warnings:
            raise GradScopeError("--early-warnings and --fail-on-warning go without --nproc")
        return run_distributed(args)
    if args.fsdp or args.step_timeout is not None:
        raise GradScopeError("--fsdp and --step-timeout go with --nproc N")
    return _run_one_process(args)


def _run_one_process(args: argparse.Namespace) -> int:
    """Load, build, run the steps; whatever stops the run (the user's code, out of memory,
    Ctrl+C, a GradScope bug), the steps finished so far are printed and written to --json
    with an ``"error"`` saying what stopped it, and the exit code follows the contract."""
    from gradscope.core.history import RunHistory
    from gradscope.core.runner import StepRunner
    from gradscope.core.sources import load_with_settings

    if args.json:
        check_output_path(args.json, "--json")
    history = RunHistory()
    trace: list = []
    loaded = settings = runner = None
    code, error, failure = EXIT_OK, None, None
    try:
        loaded, settings = load_with_settings(
            args.source, typed_overrides(args), weights=args.weights
        )
        for note in loaded.notes[1:] if loaded.path else loaded.notes:
            print(f"note: {note}", file=sys.stderr)
        runner = StepRunner(loaded, settings)
        if runner.watch is not None:
            # Every watched layer is in the report, also when step 0 fails.
            layers = runner.watch.layers
            history.ensure_layers(
                [layer.name for layer in layers],
                [layer.type_name for layer in layers],
                [layer.num_params for layer in layers],
            )
            # Named statistics' labels and schedules, for the report's "statistics".
            history.describe_statistics(getattr(runner.watch, "statistic_infos", None) or ())
        progress = Progress(settings.steps)
        try:
            for result in runner.run():
                watch = runner.watch
                assert watch is not None
                history.append(
                    result.step,
                    result.loss,
                    result.stats,
                    [layer.name for layer in watch.layers],
                    [layer.type_name for layer in watch.layers],
                    [layer.num_params for layer in watch.layers],
                    origin=result.origin,
                )
                trace.extend(result.trace or ())
                progress.update(result.step + 1, result.loss)
        finally:
            progress.close()
    except SystemExit:
        raise
    except BaseException as raised:  # whatever stopped it, the finished steps are kept
        user_files = [loaded.path] if loaded is not None and loaded.path else []
        code, failure, error = stopped_by(raised, _failed_step(runner), user_files)
    finally:
        if runner is not None:
            runner.close()
    # The report first: printing (a diagnosis that fails, a closed stdout) cannot lose it.
    if runner is not None:
        settings = runner.settings  # as used
    early = None if runner is None or runner.watch is None else runner.watch.early_warnings
    written = not args.json or write_run_report(
        args.json,
        source=loaded.source if loaded is not None else args.source,
        device=str(runner.device) if runner is not None else None,
        history=history,
        settings=settings.to_dict() if settings is not None else None,
        world_size=1,  # gradscope run is one process
        trace=trace,
        error=error,
        # null: not looked for (no --early-warnings); [] looked for, none given
        warnings=None if early is None else early.warnings,
    )
    if not written and code != EXIT_INTERRUPTED:
        code = max(code, EXIT_BAD_INPUT)
    if runner is not None:
        assert loaded is not None
        say_run_header(f"{loaded.display_name} on {runner.device}", history)
    if early is not None:
        say_early_warnings(early.warnings)
    origin = history.first_nonfinite
    if origin is not None:
        print_origin(origin, halted=runner is not None and runner.halted)
    if failure == "interrupted":
        where = " and --json hold" if args.json else " holds"
        done = f"; the summary{where} the {history.count} finished step(s)" if runner else ""
        print(f"gradscope: interrupted{done}", file=sys.stderr)
    elif isinstance(failure, GradScopeError):
        print_error(failure)
    elif failure is not None:
        print_internal_error(failure)
    if isinstance(failure, Exception) and history.count:
        print(
            f"gradscope: step {error['step']} failed; the summary"
            + (" and --json hold" if args.json else " holds")
            + f" the {history.count} finished step(s)",
            file=sys.stderr,
        )
    if code == EXIT_OK and origin is not None and args.fail_on_nonfinite:
        return EXIT_NONFINITE
    if code == EXIT_OK and early is not None and early.warnings and args.fail_on_warning:
        return EXIT_NONFINITE
    return code


def _failed_step(runner: Any) -> int | None:
    """The step that was running when the run stopped (None: before step 0 started)."""
    return None if runner is None else int(runner.step_index)
