"""``gradscope report RECORDING``: the summary and JSON of ``run``, from a recording (or a
distributed run's set of per-rank recordings)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from gradscope.cli.exits import EXIT_NONFINITE, EXIT_OK
from gradscope.cli.output import check_output_path, say, say_summary
from gradscope.cli.run_output import say_early_warnings
from gradscope.core.errors import GradScopeError


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
            check_output_path(path, option)
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
    say_summary(say, history)
    for event in run_events(history):  # settings changes and rewinds
        say(f"step {event['step']}: {event['message']}")
    origin = history.first_nonfinite
    if origin is not None:
        say(f"first non-finite value: {origin.describe()}")
    if warnings is not None:
        say_early_warnings(warnings)
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
    say_summary(say, history)
    for line in rank_lines(loaded.facts):
        say(line)
    chosen = located_origin(loaded.facts)
    if chosen is not None:
        say(f"first non-finite value (rank {chosen[0]}): {chosen[1].describe()}")
    if loaded.warnings is not None:
        say_early_warnings(loaded.warnings)
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
