"""Command line: ``gradscope [MODEL]`` opens the app; ``gradscope run SOURCE ...`` runs
headless and prints a per-layer summary. No Qt import here: the app is imported only when
it is asked for."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

EXIT_OK, EXIT_NONFINITE, EXIT_BAD_INPUT = 0, 1, 2


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
    add("--clip", type=float, help="clip the total gradient norm to this (default off)")
    add("--image-size", type=int, help="image size for torchvision models (default 224)")
    add("--layers", nargs="+", metavar="GLOB", help="layers to watch, names or globs")
    add("--seed", type=int, help="random seed (default 0)")
    add("--explode-threshold", type=float, help="grad norm above this is exploding (1000)")
    add("--vanish-threshold", type=float, help="grad norm below this is vanishing (1e-7)")
    add("--update-ratio", action="store_true", default=None, help="also measure ||dw||/||w||")
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
    from gradscope.core.errors import GradScopeError

    message = error.message if isinstance(error, GradScopeError) else str(error)
    print(f"gradscope: error: {message}", file=sys.stderr)
    for line in getattr(error, "details", []):
        print(f"  {line}", file=sys.stderr)


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


def run_command(argv: Sequence[str]) -> int:
    args = _run_parser().parse_args(list(argv))
    from gradscope.core.errors import GradScopeError

    try:
        return _run(args)
    except GradScopeError as error:
        _print_error(error)
        return EXIT_BAD_INPUT


def _run(args: argparse.Namespace) -> int:
    from gradscope.core.history import RunHistory
    from gradscope.core.loading import load_with_settings
    from gradscope.core.report import build_report, summary_table, trace_to_json, write_json
    from gradscope.core.runner import StepRunner

    loaded, settings = load_with_settings(args.source, _overrides(args), weights=args.weights)
    for note in loaded.notes[1:] if loaded.path else loaded.notes:
        print(f"note: {note}", file=sys.stderr)
    runner = StepRunner(loaded, settings)
    history = RunHistory()
    trace: list = []
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
    except KeyboardInterrupt:
        progress.close()
        print("interrupted; summary of the steps so far:", file=sys.stderr)
    else:
        progress.close()
    finally:
        runner.close()
    print(f"{loaded.display_name} on {runner.device}: {history.count} step(s)", end="")
    if history.count:
        print(f", loss {history.losses[0]:.4g} -> {history.losses[-1]:.4g}")
    else:
        print()
    print(summary_table(history))
    origin = history.first_nonfinite
    if origin is not None:
        from gradscope.core.diagnosis import explain

        first, *rest = explain(origin)
        print(f"first non-finite value: {first}")
        for line in rest:
            print(textwrap.fill(line, width=100, subsequent_indent="  "))
        if runner.halted:
            print("stopped before applying that step's optimizer update (--keep-going continues)")
    if args.json:
        report = build_report(loaded.source, str(runner.device), history)
        if settings.trace:
            report["trace"] = trace_to_json(trace)
        write_json(report, args.json)
    if origin is not None and args.fail_on_nonfinite:
        return EXIT_NONFINITE
    return EXIT_OK


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
    return parser


def report_command(argv: Sequence[str]) -> int:
    """``gradscope report RECORDING``: the summary and JSON of ``run``, from a recording."""
    args = _report_parser().parse_args(list(argv))
    from gradscope.core.errors import GradScopeError
    from gradscope.core.recording import RecordingReader, write_csv
    from gradscope.core.report import build_report, run_events, summary_table, write_json
    from gradscope.core.watch import STATUS_NONFINITE

    try:
        with RecordingReader(args.recording) as reader:
            _, history = reader.load()
            live = reader.is_live()
            loss_recorded = reader.loss_recorded
            source, device = reader.source, reader.device
        print(f"{source} on {device}: {history.count} step(s)", end="")
        if loss_recorded.any():
            losses = history.losses[loss_recorded]
            print(f", loss {losses[0]:.4g} -> {losses[-1]:.4g}")
        else:
            print()
        if live:
            print("note: the recording is still being written", file=sys.stderr)
        print(summary_table(history))
        for event in run_events(history):  # settings changes and rewinds
            print(f"step {event['step']}: {event['message']}")
        origin = history.first_nonfinite
        if origin is not None:
            print(f"first non-finite value: {origin.describe()}")
        if args.json:
            report = build_report(source, device, history)
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
    except GradScopeError as error:
        _print_error(error)
        return EXIT_BAD_INPUT
    nonfinite = origin is not None or bool((history.status_matrix() == STATUS_NONFINITE).any())
    if nonfinite and args.fail_on_nonfinite:
        return EXIT_NONFINITE
    return EXIT_OK


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
    """``gradscope open RECORDING``: the app on a recording (following it while it is being
    written). A file that is no readable recording is reported here, before any window."""
    parser = argparse.ArgumentParser(
        prog="gradscope open", description="Show a GradScope recording in the app."
    )
    parser.add_argument("recording", help="a .gsrec file written by gradscope.watch(record=...)")
    parser.add_argument("--screenshot", metavar="PNG", help="save a screenshot and exit")
    args = parser.parse_args(list(argv))
    from gradscope.core.errors import GradScopeError
    from gradscope.core.recording import RecordingReader

    try:
        RecordingReader(args.recording).close()
    except GradScopeError as error:
        _print_error(error)
        return EXIT_BAD_INPUT
    launch = _app_launcher()
    if launch is None:
        return EXIT_BAD_INPUT
    return launch(model=None, overrides={}, screenshot=args.screenshot, recording=args.recording)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        return run_command(argv[1:])
    if argv and argv[0] == "report":
        return report_command(argv[1:])
    if argv and argv[0] == "open":
        return open_command(argv[1:])
    return app_command(argv)


if __name__ == "__main__":
    raise SystemExit(main())
