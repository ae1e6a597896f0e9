"""Command line: ``gradscope [MODEL]`` opens the app; ``gradscope run SOURCE ...`` runs
headless and prints a per-layer summary; ``report``, ``open`` and ``attach`` work on
recordings and scripts. One module per command; no Qt import here: the app is imported
only when it is asked for."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Sequence

from gradscope.cli.app import app_command
from gradscope.cli.attach import attach_command
from gradscope.cli.exits import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    print_error,
    print_internal_error,
)
from gradscope.cli.open_recording import open_command
from gradscope.cli.output import Stdout, silence_stdout
from gradscope.cli.report import report_command
from gradscope.cli.run import run_command
from gradscope.core.errors import GradScopeError


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
    Stdout.closed = False
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
        print_error(error)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # stdout's reader went away outside say() (argparse's --help | head, say)
        silence_stdout()
        return EXIT_OK
    except Exception as error:
        print_internal_error(error)
        return EXIT_INTERNAL
