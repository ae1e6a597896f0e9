"""What the commands write: stdout that survives a reader that went away, the progress bar,
the per-layer table, and output files checked before any work starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gradscope.core.errors import GradScopeError


def check_output_path(path_text: str, option: str) -> None:
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


class Stdout:
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
            silence_stdout()


def silence_stdout() -> None:
    """Point stdout at the null device, so the interpreter's final flush of what is still
    buffered does not report the broken pipe again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


say = Stdout.write


class Progress:
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


def say_summary(say: Any, history: Any) -> None:
    """The per-layer table, and the loss scaler's line when the run had one."""
    from gradscope.core.report import mixed_precision_line, summary_table

    say(summary_table(history))
    scaler_line = mixed_precision_line(history)
    if scaler_line:
        say(scaler_line)
