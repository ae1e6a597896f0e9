"""Command line: ``gradscope [MODEL]`` opens the app; ``gradscope run SOURCE ...`` runs
headless and prints a per-layer summary. No Qt import here: the app is imported only when
it is asked for."""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import textwrap
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gradscope.core.errors import GradScopeError

# The exit-code contract (README "Exit codes"): CI pipelines gate on these.
EXIT_OK = 0  # the run finished
EXIT_NONFINITE = (
    1  # a NaN/Inf was found and --fail-on-nonfinite given (or a warning, --fail-on-warning)
)
EXIT_BAD_INPUT = 2  # bad input, including an error in the user's own code
EXIT_INTERNAL = 3  # a GradScope bug
EXIT_INTERRUPTED = 130  # Ctrl+C (128 + SIGINT, as shells report it)

_REPORT_BUG = "this is a bug in GradScope; please report it with the traceback below"


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``gradscope run`` and the app; all default to None so that only
    what the user typed overrides a script's CONFIG."""
    add = parser.add_argument
    add("--steps", type=int, help="number of training steps (default 50)")
    add("--batch-size", type=int, help="batch size (default 8)")
    add("--device", help="auto, cpu, cuda or cuda:N (default auto)")
    add(
        "--optimizer",
        choices=("sgd", "adam", "adamw"),
        help="optimizer (default sgd, momentum 0.9)",
    )
    add("--lr", type=float, help="learning rate (default 0.01)")
    add("--momentum", type=float, help="SGD momentum (default 0.9)")
    add("--weight-decay", type=float, help="weight decay (default 0)")
    add("--loss-scale", type=float, help="multiply the loss by this (provokes explosion)")
    add(
        "--amp",
        choices=("bf16", "fp16"),
        help="mixed precision: autocast (and a GradScaler for fp16) on forward and loss",
    )
    add("--clip", type=float, help="clip the total gradient norm to this (default off)")
    add("--image-size", type=int, help="image size for torchvision models (default 224)")
    add("--seq-len", type=int, help="tokens per sequence for hf: models (default 128)")
    add(
        "--config",
        action="append",
        dest="model_config",
        metavar="KEY=VALUE",
        help="set a config value of an hf:/timm: model (repeatable)",
    )
    add("--layers", nargs="+", metavar="GLOB", help="layers to watch, names or globs")
    add("--seed", type=int, help="random seed (default 0)")
    add("--explode-threshold", type=float, help="grad norm above this is exploding (1000)")
    add("--vanish-threshold", type=float, help="grad norm below this is vanishing (1e-7)")
    add(
        "--vanish-steps",
        type=int,
        metavar="N",
        help="vanishing once under the threshold for N consecutive steps (default 3)",
    )
    add("--update-ratio", action="store_true", default=None, help="also measure ||dw||/||w||")
    add(
        "--detail-every",
        type=int,
        metavar="K",
        help="max |g|, weight norm and update ratio every K-th step (default 1: every step)",
    )
    add(
        "--statistic",
        action="append",
        dest="statistics",
        metavar="MODULE:CLASS",
        help="also measure this gradscope.Statistic subclass, imported from the current "
        "folder or sys.path (or a .py file); repeatable",
    )
    add(
        "--early-warnings",
        action="store_true",
        default=None,
        help="warn before a NaN/Inf: outputs or the loss that spike, drift upwards or near "
        'their dtype\'s limits (JSON: "warnings")',
    )
    add(
        "--keep-going",
        action="store_true",
        default=None,
        help="continue after a NaN/Inf instead of stopping before that optimizer step",
    )
    add("--weights", help="a state-dict file for a torchvision model (loaded weights_only)")
    add(
        "--trace",
        action="store_true",
        default=None,
        help='record every forward call and backward gradient of each step (JSON: "trace")',
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The run settings the user typed (argparse dests are the RunSettings field names)."""
    from gradscope.core.settings import SETTING_NAMES

    return {n: getattr(args, n) for n in SETTING_NAMES if getattr(args, n, None) is not None}


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope run",
        description="Train a model for a few steps headless and report per-layer gradients.",
    )
    parser.add_argument("source", help="a .py model script or a torchvision model name")
    _add_run_options(parser)
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


def _app_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope",
        description="GradScope: inspect PyTorch gradients "
        "(`gradscope run --help` for headless runs).",
    )
    parser.add_argument("model", nargs="?", help="a .py model script or a torchvision model name")
    _add_run_options(parser)
    parser.add_argument(
        "--screenshot",
        metavar="PNG",
        help="run the steps, save a screenshot of the window and exit",
    )
    parser.add_argument("--version", action="store_true", help="print versions and exit")
    return parser


def _print_error(error: Exception) -> None:
    """One clear message, then the user's own frames (no "Traceback" header)."""
    message = error.message if isinstance(error, GradScopeError) else str(error)
    print(f"gradscope: error: {message}", file=sys.stderr)
    for line in getattr(error, "details", []):
        print(f"  {line}", file=sys.stderr)


def _internal_traceback(error: BaseException) -> list[str]:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return text.rstrip("\n").splitlines()


def _print_internal_error(error: BaseException) -> None:
    print(f"gradscope: internal error: {type(error).__name__}: {error}", file=sys.stderr)
    print(f"gradscope: {_REPORT_BUG}", file=sys.stderr)
    for line in _internal_traceback(error):
        print(line, file=sys.stderr)


def _check_output_path(path_text: str, option: str) -> None:
    """Refuse an output file that cannot be written before any work starts: a run's report
    must not be lost at its end."""
    path = Path(path_text).expanduser()
    if path.is_dir():
        raise GradScopeError(f"{option} {path_text}: is a folder; give a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise GradScopeError(f"{option} {path_text}: the file is not writable")
    parent = path.parent
    if not parent.is_dir():
        raise GradScopeError(f"{option} {path_text}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GradScopeError(f"{option} {path_text}: the folder {parent} is not writable")


class _Stdout:
    """Writes to stdout that survive a reader that went away (``gradscope run X | head``):
    the rest of the output is dropped, the JSON is still written and the exit code still
    says how the run went."""

    closed = False

    @classmethod
    def write(cls, text: str = "", end: str = "\n") -> None:
        if cls.closed:
            return
        try:
            sys.stdout.write(text + end)
            sys.stdout.flush()
        except BrokenPipeError:
            cls.closed = True
            _silence_stdout()


def _silence_stdout() -> None:
    """Point stdout at the null device, so the interpreter's final flush of what is still
    buffered does not report the broken pipe again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


say = _Stdout.write


class _Progress:
    """A one-line progress bar on stderr, only when it is a terminal."""

    def __init__(self, total: int) -> None:
        self.total = max(total, 1)
        self.enabled = sys.stderr.isatty()

    def update(self, done: int, loss: float) -> None:
        if not self.enabled:
            return
        filled = int(30 * done / self.total)
        bar = "#" * filled + "." * (30 - filled)
        print(
            f"\r[{bar}] step {done}/{self.total}  loss {loss:.4g}",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


def _say_summary(say: Any, history: Any) -> None:
    """The per-layer table, and the loss scaler's line when the run had one."""
    from gradscope.core.report import mixed_precision_line, summary_table

    say(summary_table(history))
    scaler_line = mixed_precision_line(history)
    if scaler_line:
        say(scaler_line)


def run_command(argv: Sequence[str]) -> int:
    args = _run_parser().parse_args(list(argv))
    return _run(args)


def _error_json(step: int | None, message: str, lines: Sequence[str]) -> dict[str, Any]:
    """``"error"`` of a report: what stopped the run, at which step (None: before step 0)."""
    return {"step": step, "message": message, "traceback": list(lines)}


def _stopped_by(
    raised: BaseException, step: int | None, user_files: Sequence[Path]
) -> tuple[int, Any, dict[str, Any]]:
    """What ended a run early, by the exit-code contract: ``(exit code, what to print,
    the report's "error")``; what to print is "interrupted", a GradScopeError (bad input,
    the user's own code) or the exception of a GradScope bug. SystemExit is not handled
    here: it keeps its meaning."""
    if isinstance(raised, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted", _error_json(step, "interrupted (Ctrl+C)", [])
    if not isinstance(raised, Exception):
        # A BaseException subclass (asyncio.CancelledError, a class of the user's own)
        # raised in the user's code, say their forward: their error, with their frames.
        from gradscope.core.errors import ModelScriptError
        from gradscope.core.loading import user_traceback

        raised = ModelScriptError(
            f"the run was stopped by {type(raised).__name__}: {raised}",
            user_traceback(raised, list(user_files)),
        )
    if isinstance(raised, GradScopeError):
        return EXIT_BAD_INPUT, raised, _error_json(step, raised.message, raised.details)
    message = f"internal error: {type(raised).__name__}: {raised}; {_REPORT_BUG}"
    return EXIT_INTERNAL, raised, _error_json(step, message, _internal_traceback(raised))


def _write_run_report(
    json_path: str,
    *,
    source: str,
    device: str | None,
    history: Any,
    settings: dict[str, Any] | None,
    world_size: int | None,
    trace: Sequence[Any],
    error: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
    warnings: Sequence[Any] | None = None,
) -> bool:
    """The one report of ``gradscope run`` (one process or N), written to ``json_path``
    whatever stopped the run; False, with the reason on stderr, when it cannot be written."""
    from gradscope.core.report import build_report, trace_to_json, write_json

    report = build_report(
        source, device, history, settings=settings, world_size=world_size, warnings=warnings
    )
    report.update(extra or {})
    if settings is not None and settings.get("trace"):
        report["trace"] = trace_to_json(trace)
    report["error"] = error
    try:
        write_json(report, json_path)
    except OSError as written:
        print(f"gradscope: error: cannot write {json_path}: {written}", file=sys.stderr)
        return False
    return True


def _say_run_header(title: str, history: Any, loss_of: str = "") -> None:
    """``NAME on DEVICE: N step(s), loss a -> b`` and the per-layer table."""
    say(f"{title}: {history.count} step(s)", end="")
    if history.count:
        say(f", {loss_of}loss {history.losses[0]:.4g} -> {history.losses[-1]:.4g}")
    else:
        say()
    _say_summary(say, history)


def _run(args: argparse.Namespace) -> int:
    if args.fail_on_warning:
        args.early_warnings = True
    if args.nproc is not None:
        if args.early_warnings:
            raise GradScopeError("--early-warnings and --fail-on-warning go without --nproc")
        return _run_distributed(args)
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
        _check_output_path(args.json, "--json")
    history = RunHistory()
    trace: list = []
    loaded = settings = runner = None
    code, error, failure = EXIT_OK, None, None
    try:
        loaded, settings = load_with_settings(args.source, _overrides(args), weights=args.weights)
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
        progress = _Progress(settings.steps)
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
        code, failure, error = _stopped_by(raised, _failed_step(runner), user_files)
    finally:
        if runner is not None:
            runner.close()
    # The report first: printing (a diagnosis that fails, a closed stdout) cannot lose it.
    if runner is not None:
        settings = runner.settings  # as used
    early = None if runner is None or runner.watch is None else runner.watch.early_warnings
    written = not args.json or _write_run_report(
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
        _say_run_header(f"{loaded.display_name} on {runner.device}", history)
    if early is not None:
        _say_early_warnings(early.warnings)
    origin = history.first_nonfinite
    if origin is not None:
        _print_origin(origin, halted=runner is not None and runner.halted)
    if failure == "interrupted":
        where = " and --json hold" if args.json else " holds"
        done = f"; the summary{where} the {history.count} finished step(s)" if runner else ""
        print(f"gradscope: interrupted{done}", file=sys.stderr)
    elif isinstance(failure, GradScopeError):
        _print_error(failure)
    elif failure is not None:
        _print_internal_error(failure)
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


_WARNINGS_SHOWN = 10


def _say_early_warnings(warnings: Sequence[Any]) -> None:
    """The early warnings, first ones first: each one's step, kind and evidence."""
    if not warnings:
        say("early warnings: none")
        return
    say(f"early warnings: {len(warnings)}")
    for warning in warnings[:_WARNINGS_SHOWN]:
        say(f"  {warning.describe()}")
        if warning.hint:
            say(f"    hint: {warning.hint}")
    if len(warnings) > _WARNINGS_SHOWN:
        say(f"  ... and {len(warnings) - _WARNINGS_SHOWN} more (--json has them all)")


def _print_origin(origin: Any, *, halted: bool, rank: int | None = None) -> None:
    """The origin's explanation (its one-line description when explaining fails)."""
    from gradscope.core.diagnosis import explain

    try:
        first, *rest = explain(origin)
    except Exception as raised:  # the run and its report stand; say what is known
        first, rest = origin.describe(), []
        print(
            f"gradscope: warning: explaining the origin failed ({type(raised).__name__}: "
            f"{raised}); this is a bug in GradScope, please report it",
            file=sys.stderr,
        )
    where = f" (rank {rank})" if rank is not None else ""
    say(f"first non-finite value{where}: {first}")
    for line in rest:
        say(textwrap.fill(line, width=100, subsequent_indent="  "))
    if halted:
        say("stopped before applying that step's optimizer update (--keep-going continues)")


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


def _run_distributed(args: argparse.Namespace) -> int:
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
        _check_output_path(args.json, "--json")
    step_timeout = DEFAULT_STEP_TIMEOUT if args.step_timeout is None else args.step_timeout
    if not step_timeout > 0:
        raise GradScopeError(f"--step-timeout must be > 0, not {args.step_timeout}")
    try:
        # The script is loaded here first: a bad script, setting or request is one message
        # before any process starts.
        overrides = _overrides(args)
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
        stopped, _, error = _stopped_by(raised, None, user_files)
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
        written = _write_run_report(
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
        _say_run_header(title, history, loss_of="rank 0 ")
    for line in rank_lines(run.ranks):
        say(line)
    origin = run.origin
    if origin is not None:
        _print_origin(origin, halted=run.halted, rank=run.origin_rank)
    if run.error is not None:
        if run.failure == "interrupted":
            print("gradscope: interrupted", file=sys.stderr)
        else:
            prefix = "internal error: " if run.failure == "internal" else ""
            print(f"gradscope: error: {prefix}{run.error['message']}", file=sys.stderr)
            if run.failure == "internal":
                print(f"gradscope: {_REPORT_BUG}", file=sys.stderr)
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


def _failed_step(runner: Any) -> int | None:
    """The step that was running when the run stopped (None: before step 0 started)."""
    return None if runner is None else int(runner.step_index)


def _report_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope report",
        description="Summarise a recording (.gsrec) as `gradscope run` does; the JSON has "
        "the same schema.",
    )
    parser.add_argument("recording", help="a recording written by gradscope.watch(record=...)")
    parser.add_argument("--json", metavar="PATH", help="write the report as strict JSON")
    parser.add_argument(
        "--csv", metavar="PATH", help="write step,layer,statistic... rows of every layer"
    )
    parser.add_argument(
        "--fail-on-nonfinite",
        action="store_true",
        help="exit with status 1 when the recording holds a NaN/Inf",
    )
    _add_tensorboard_option(parser)
    return parser


def _add_tensorboard_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write the per-layer statistics as TensorBoard scalars into DIR "
        '(pip install "gradscope[tensorboard]")',
    )


def _write_tensorboard(args: argparse.Namespace, history: Any) -> None:
    """``report --tensorboard DIR``: the recording's steps as TensorBoard events."""
    if not getattr(args, "tensorboard", None):
        return
    from gradscope.core.export.tensorboard_report import write_tensorboard

    written = write_tensorboard(history, args.tensorboard)
    print(f"wrote {written} step(s) to TensorBoard events in {args.tensorboard}", file=sys.stderr)


def report_command(argv: Sequence[str]) -> int:
    """``gradscope report RECORDING``: the summary and JSON of ``run``, from a recording."""
    args = _report_parser().parse_args(list(argv))
    from gradscope.core.facts import STATUS_NONFINITE
    from gradscope.core.recording import RecordingReader, write_csv
    from gradscope.core.report import (
        build_report,
        run_events,
        write_json,
    )

    for path, option in ((args.json, "--json"), (args.csv, "--csv")):
        if path:
            _check_output_path(path, option)
    from gradscope.core.recording.rank_set import find_rank_set

    recordings = find_rank_set(args.recording)
    if recordings is not None:
        return _report_rank_set(args, recordings)
    with RecordingReader(args.recording, snapshot=True) as reader:
        _, history = reader.load()
        live = reader.is_live()
        loss_recorded = reader.loss_recorded
        source, device = reader.source, reader.device
        settings, world_size = reader.settings, reader.info.get("world_size")
        # null: the run did not look for them; [] it did, and none came
        warnings = history.warnings if reader.looked_for_warnings else None
    say(f"{source} on {device}: {history.count} step(s)", end="")
    if loss_recorded.any():
        losses = history.losses[loss_recorded]
        say(f", loss {losses[0]:.4g} -> {losses[-1]:.4g}")
    else:
        say()
    if live:
        print("note: the recording is still being written", file=sys.stderr)
    _say_summary(say, history)
    for event in run_events(history):  # settings changes and rewinds
        say(f"step {event['step']}: {event['message']}")
    origin = history.first_nonfinite
    if origin is not None:
        say(f"first non-finite value: {origin.describe()}")
    if warnings is not None:
        _say_early_warnings(warnings)
    if args.json:
        report = build_report(
            source,
            device,
            history,
            settings=settings,
            world_size=_count_or_none(world_size),
            warnings=warnings,
        )
        # A step whose loss was not given is null, as an unwatched layer's value is.
        report["loss"] = [
            v if given else None
            for v, given in zip(report["loss"], loss_recorded.tolist(), strict=True)
        ]
        try:
            write_json(report, args.json)
        except OSError as error:
            raise GradScopeError(f"cannot write {args.json}: {error.strerror}") from None
    if args.csv:
        write_csv(history, args.csv)
    _write_tensorboard(args, history)
    nonfinite = origin is not None or bool((history.status_matrix() == STATUS_NONFINITE).any())
    if nonfinite and args.fail_on_nonfinite:
        return EXIT_NONFINITE
    return EXIT_OK


def _report_rank_set(args: argparse.Namespace, recordings: Any) -> int:
    """``gradscope report`` on a distributed run's per-rank recordings: rank 0's summary (the
    statistics cover every rank), each rank's losses and which rank went non-finite first;
    the JSON adds ``"ranks"`` and ``"first_nonfinite_rank"``, and ``first_nonfinite`` is the
    origin a rank located (with its ``"rank"``)."""
    from gradscope.core.rank_facts import located_origin, rank_lines, ranks_json
    from gradscope.core.recording import write_csv
    from gradscope.core.recording.rank_set import load_rank_set
    from gradscope.core.report import (
        build_report,
        origin_to_json,
        write_json,
    )

    loaded = load_rank_set(recordings)
    history = loaded.primary_history
    rank = recordings.primary_rank
    world = recordings.world_size
    processes = f" x {world} processes" if world is not None else ""
    say(
        f"{loaded.source} on {loaded.device}{processes} (rank {rank}'s recording of "
        f"{len(recordings.paths)}): {history.count} step(s)",
        end="",
    )
    if loaded.loss_recorded.any():
        losses = history.losses[loaded.loss_recorded]
        say(f", loss {losses[0]:.4g} -> {losses[-1]:.4g}")
    else:
        say()
    for note in recordings.notes:
        print(f"note: {note}", file=sys.stderr)
    if loaded.live:
        print("note: the recordings are still being written", file=sys.stderr)
    _say_summary(say, history)
    for line in rank_lines(loaded.facts):
        say(line)
    chosen = located_origin(loaded.facts)
    if chosen is not None:
        say(f"first non-finite value (rank {chosen[0]}): {chosen[1].describe()}")
    if loaded.warnings is not None:
        _say_early_warnings(loaded.warnings)
    if args.json:
        report = build_report(
            loaded.source,
            loaded.device,
            history,
            settings=loaded.settings,
            world_size=world,
            warnings=loaded.warnings,
        )
        report["loss"] = [
            v if given else None
            for v, given in zip(report["loss"], loaded.loss_recorded.tolist(), strict=True)
        ]
        if chosen is not None:
            report["first_nonfinite"] = origin_to_json(chosen[1])
            report["first_nonfinite"]["rank"] = chosen[0]
        report.update(ranks_json(loaded.facts))
        report["recordings"] = {str(r): str(p) for r, p in sorted(recordings.paths.items())}
        try:
            write_json(report, args.json)
        except OSError as error:
            raise GradScopeError(f"cannot write {args.json}: {error.strerror}") from None
    if args.csv:
        write_csv(history, args.csv)
    _write_tensorboard(args, history)
    nonfinite = chosen is not None or any(facts.nonfinite for facts in loaded.facts)
    if nonfinite and args.fail_on_nonfinite:
        return EXIT_NONFINITE
    return EXIT_OK


def _count_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _versions() -> str:
    import platform

    import gradscope

    parts = [f"gradscope {gradscope.__version__}", f"Python {platform.python_version()}"]
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


def _app_launcher() -> Any:
    """The app's ``launch``, imported only now (Qt is heavy); None, with the reason on
    stderr, when the app cannot start here."""
    try:
        from gradscope.gui.app import launch
    except ImportError as error:
        print(f"gradscope: error: the app cannot start: {error}", file=sys.stderr)
        return None
    return launch


def app_command(argv: Sequence[str]) -> int:
    args = _app_parser().parse_args(list(argv))
    if args.version:
        print(_versions())
        return EXIT_OK
    launch = _app_launcher()
    if launch is None:
        return EXIT_BAD_INPUT
    return launch(
        model=args.model,
        overrides=_overrides(args),
        weights=args.weights,
        screenshot=args.screenshot,
    )


def open_command(argv: Sequence[str]) -> int:
    """``gradscope open RECORDING [MORE...]``: the app on a recording (following it while it
    is being written), with any further recordings compared on the same axes. A file that
    is no readable recording is reported here, before any window."""
    parser = argparse.ArgumentParser(
        prog="gradscope open", description="Show a GradScope recording in the app."
    )
    parser.add_argument("recording", help="a .gsrec file written by gradscope.watch(record=...)")
    parser.add_argument(
        "compare", nargs="*", help="more recordings, drawn on the same axes to compare runs"
    )
    parser.add_argument("--screenshot", metavar="PNG", help="save a screenshot and exit")
    parser.add_argument(
        "--statistic",
        metavar="NAME",
        help="the statistic the gradient-norm plot shows: grad_norm, max_abs, weight_norm, "
        "update_ratio, param_grad_norm or a named one the recording holds (its name)",
    )
    args = parser.parse_args(list(argv))
    from gradscope.core.errors import GradScopeError
    from gradscope.core.recording.rank_set import find_rank_set, load_rank_set
    from gradscope.core.recording.reader import check_recording

    path = args.recording
    try:
        recordings = find_rank_set(path)
        if recordings is not None:
            # A distributed run's set: the rank named, or rank 0 for the common name.
            named = Path(path).expanduser()
            path = str(named if named in recordings.paths.values() else recordings.primary)
            others = ", ".join(p.name for p in recordings.paths.values() if str(p) != path)
            print(
                f"note: showing {Path(path).name}; the set's other ranks: {others or 'none'}",
                file=sys.stderr,
            )
            for note in recordings.notes:
                print(f"note: {note}", file=sys.stderr)
            load_rank_set(recordings)  # the window reads every rank's file
        # What the window reads, read here: a damaged file is one message, not a dialog
        # after the window opened (and an exit 2 with nothing said).
        for each in (path, *args.compare):
            history = check_recording(each)
            if each == path and args.statistic is not None:
                _check_statistic(args.statistic, [*history.statistic_names, "param_grad_norm"])
    except GradScopeError as error:
        _print_error(error)
        return EXIT_BAD_INPUT
    launch = _app_launcher()
    if launch is None:
        return EXIT_BAD_INPUT
    return launch(
        model=None,
        overrides={},
        screenshot=args.screenshot,
        recording=path,
        compare=list(args.compare),
        statistic=args.statistic,
    )


def _check_statistic(name: str, held: list[str]) -> None:
    if name not in held:
        from gradscope.core.errors import GradScopeError

        raise GradScopeError(
            f"--statistic {name}: the recording holds no statistic of that name; it holds "
            f"{', '.join(held)}"
        )


def _attach_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradscope attach",
        description="Run an unmodified training script and record every model its "
        "optimizers step, one step per optimizer.step(). The script's stdout and exit code "
        "are its own; GradScope writes to stderr only.",
    )
    parser.add_argument(
        "--record",
        metavar="PATH",
        help="the recording (default: a new file in the per-user runs folder); a second "
        "model goes beside it as PATH-stem.<Class>.gsrec",
    )
    parser.add_argument("--open", action="store_true", help="open the app on the recording")
    parser.add_argument("--layers", nargs="+", metavar="GLOB", help="watch only these layers")
    parser.add_argument("--detail-every", type=int, metavar="K", help="detail every K-th step")
    parser.add_argument(
        "--statistic",
        action="append",
        dest="statistics",
        default=[],
        metavar="MODULE:CLASS",
        help="also measure this gradscope.Statistic subclass (repeatable)",
    )
    parser.add_argument(
        "--fail-on-nonfinite",
        action="store_true",
        help="exit with status 1 when a NaN/Inf was recorded (and the script exited 0)",
    )
    parser.add_argument(
        "--early-warnings",
        action="store_true",
        help="warn before a NaN/Inf: outputs or the loss that spike, drift upwards or near "
        "their dtype's limits (in the summary and the recording)",
    )
    parser.add_argument(
        "--fail-on-warning",
        action="store_true",
        help="exit with status 1 when an early warning was given (and the script exited 0; "
        "turns --early-warnings on)",
    )
    parser.add_argument(
        "--tensorboard", metavar="DIR", help="also write TensorBoard scalars into DIR"
    )
    parser.add_argument("script", help="the training script (.py), run as __main__")
    parser.add_argument("args", nargs="*", help="the script's own arguments, as given")
    return parser


_ATTACH_VALUED = ("--record", "--detail-every", "--tensorboard", "--statistic")


def _split_attach_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """GradScope's options, and ``SCRIPT ARGS...`` (never parsed: they are the script's).
    The script is the first word that is neither an option nor an option's value; the
    values of ``--layers`` run until the next option or the first ``.py`` word."""
    argv = list(argv)
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return argv[:index], argv[index + 1 :]
        if word in _ATTACH_VALUED:
            index += 2
        elif word == "--layers":
            index += 1
            while index < len(argv) and not argv[index].startswith("-"):
                if argv[index].endswith(".py"):
                    break
                index += 1
        elif word.startswith("-"):
            index += 1
        else:
            break
    return argv[:index], argv[index:]


def attach_command(argv: Sequence[str]) -> int:
    """``gradscope attach [options] SCRIPT [ARGS...]``."""
    options, rest = _split_attach_argv(argv)
    parser = _attach_parser()
    args = parser.parse_args([*options, "--", *rest[:1]])
    from gradscope.core.attach.command import attach

    return attach(
        args.script,
        rest[1:],
        record=args.record,
        layers=args.layers,
        detail_every=args.detail_every,
        tensorboard=args.tensorboard,
        open_app=args.open,
        fail_on_nonfinite=args.fail_on_nonfinite,
        statistics=args.statistics,
        early_warnings=args.early_warnings,
        fail_on_warning=args.fail_on_warning,
    )


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "attach":
        return attach_command(argv[1:])
    if argv and argv[0] == "run":
        return run_command(argv[1:])
    if argv and argv[0] == "report":
        return report_command(argv[1:])
    if argv and argv[0] == "open":
        return open_command(argv[1:])
    return app_command(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The exit-code contract holds whatever happens: 2 with one message for bad input
    (the user's own frames after it), 3 with "please report" and the traceback for a
    GradScope bug, 130 with one line for Ctrl+C."""
    as_command = argv is None  # the process's own entry point (not a call from Python)
    argv = list(sys.argv[1:] if argv is None else argv)
    _Stdout.closed = False
    code = _main(argv)
    if as_command:
        _leave_without_waiting_for_threads(code)
    return code


def _leave_without_waiting_for_threads(code: int) -> None:
    """With its output written, a command does not wait for threads the model script
    started and left running (Python's shutdown would join them for ever): it names them
    and leaves as the distributed ranks do, after the atexit handlers."""
    left = [
        thread
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
    ]
    if not left:
        return
    names = ", ".join(repr(thread.name) for thread in left)
    print(
        f"gradscope: note: not waiting for {len(left)} thread(s) the model left running ({names})",
        file=sys.stderr,
    )
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _main(argv: list[str]) -> int:
    try:
        return _dispatch(argv)
    except KeyboardInterrupt:
        print("gradscope: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except GradScopeError as error:
        _print_error(error)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # stdout's reader went away outside say() (argparse's --help | head, say)
        _silence_stdout()
        return EXIT_OK
    except Exception as error:
        _print_internal_error(error)
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
