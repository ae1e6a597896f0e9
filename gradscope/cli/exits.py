"""The exit-code contract (README "Exit codes") and how a failure is told: one message
for bad input, "please report" and the traceback for a GradScope bug."""

from __future__ import annotations

import sys
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


REPORT_BUG = "this is a bug in GradScope; please report it with the traceback below"


def print_error(error: Exception) -> None:
    """One clear message, then the user's own frames (no "Traceback" header)."""
    message = error.message if isinstance(error, GradScopeError) else str(error)
    print(f"gradscope: error: {message}", file=sys.stderr)
    for line in getattr(error, "details", []):
        print(f"  {line}", file=sys.stderr)


def internal_traceback(error: BaseException) -> list[str]:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return text.rstrip("\n").splitlines()


def print_internal_error(error: BaseException) -> None:
    print(f"gradscope: internal error: {type(error).__name__}: {error}", file=sys.stderr)
    print(f"gradscope: {REPORT_BUG}", file=sys.stderr)
    for line in internal_traceback(error):
        print(line, file=sys.stderr)


def error_json(step: int | None, message: str, lines: Sequence[str]) -> dict[str, Any]:
    """``"error"`` of a report: what stopped the run, at which step (None: before step 0)."""
    return {"step": step, "message": message, "traceback": list(lines)}


def stopped_by(
    raised: BaseException, step: int | None, user_files: Sequence[Path]
) -> tuple[int, Any, dict[str, Any]]:
    """What ended a run early, by the exit-code contract: ``(exit code, what to print,
    the report's "error")``; what to print is "interrupted", a GradScopeError (bad input,
    the user's own code) or the exception of a GradScope bug. SystemExit is not handled
    here: it keeps its meaning."""
    if isinstance(raised, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted", error_json(step, "interrupted (Ctrl+C)", [])
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
        return EXIT_BAD_INPUT, raised, error_json(step, raised.message, raised.details)
    message = f"internal error: {type(raised).__name__}: {raised}; {REPORT_BUG}"
    return EXIT_INTERNAL, raised, error_json(step, message, internal_traceback(raised))
