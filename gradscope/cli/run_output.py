"""What ``gradscope run`` prints and writes once its steps ended (one process or N): the
report, the summary's header, the early warnings and the origin's explanation."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from gradscope.cli.output import say, say_summary


def write_run_report(
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


def say_run_header(title: str, history: Any, loss_of: str = "") -> None:
    """``NAME on DEVICE: N step(s), loss a -> b`` and the per-layer table."""
    say(f"{title}: {history.count} step(s)", end="")
    if history.count:
        say(f", {loss_of}loss {history.losses[0]:.4g} -> {history.losses[-1]:.4g}")
    else:
        say()
    say_summary(say, history)


_WARNINGS_SHOWN = 10


def say_early_warnings(warnings: Sequence[Any]) -> None:
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


def print_origin(origin: Any, *, halted: bool, rank: int | None = None) -> None:
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
