"""Running a script as ``python SCRIPT ARGS...`` would: as ``__main__``, with ``sys.argv``
set to ``[SCRIPT, *ARGS]``, its folder first on ``sys.path``, the working directory left
as it is, and its exit code as ``python`` gives it (``sys.exit(n)``: n; an uncaught
exception: its traceback on stderr and 1; Ctrl+C: 130)."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

from gradscope.core.errors import GradScopeError

EXIT_UNCAUGHT = 1
EXIT_INTERRUPTED = 130


def check_script(script: str) -> Path:
    path = Path(script)
    if not path.is_file():
        raise GradScopeError(f"no script at {script}" + (" (a folder)" if path.is_dir() else ""))
    return path


def _exit_code(code: object) -> int:
    """``SystemExit.code`` as the interpreter turns it into a status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


def _print_user_traceback(error: BaseException) -> None:
    """The traceback Python would print, without this module's frames on top."""
    tb = error.__traceback__
    ours = (__file__, runpy.__file__, "<frozen runpy>")
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    sys.stderr.write("".join(traceback.format_exception(type(error), error, tb)))
    sys.stderr.flush()


def run_script(script: str, args: list[str]) -> int:
    """Run ``script`` with ``args`` and return its exit code."""
    path = check_script(script)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        # The absolute path, as ``python SCRIPT`` compiles it (tracebacks name it so).
        runpy.run_path(os.path.abspath(path), run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BaseException as error:
        _print_user_traceback(error)
        code = EXIT_UNCAUGHT
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
    return code
