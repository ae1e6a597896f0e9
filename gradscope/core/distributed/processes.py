"""Whether a process of the run (the launcher, a rank) has ended: the launcher waits on its
ranks with it, and each rank watches its launcher."""

from __future__ import annotations

import os


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped by its parent has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's: not ours, but not gone
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # no /proc (macOS): the signal said it is there
        return False
    return state in ("Z", "X")
