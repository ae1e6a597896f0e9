"""The writer lock of a recording.

One writer per file: the writer holds a lock row (process id, host, random token, heartbeat
refreshed every ~2 s by the writer thread, also when no steps arrive). A second writer gets
a :class:`~gradscope.core.errors.GradScopeError` naming the process that writes. A lock is
stale, and may be taken over, when its process no longer exists (same host; this is how a
SIGKILLed writer's file becomes writable again at once) or its heartbeat is older than
``STALE_SECONDS`` (a writer on another host, a reused process id, a frozen process). The
check-and-claim happens in one ``BEGIN IMMEDIATE`` transaction, and every commit first
checks that the lock still carries the writer's token, so a writer that was taken over
stops instead of interleaving steps.
"""

from __future__ import annotations

import os
import socket
import time

STALE_SECONDS = 30.0
HEARTBEAT_SECONDS = 2.0


# -- locking ------------------------------------------------------------------------------
def _process_exists(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_is_held(pid: int | None, host: str | None, heartbeat: float | None) -> bool:
    if pid is None or heartbeat is None:
        return False
    if time.time() - heartbeat > STALE_SECONDS:
        return False
    if host == socket.gethostname():
        return _process_exists(int(pid))
    return True


def _describe_writer(pid: int, host: str) -> str:
    here = host == socket.gethostname()
    return f"process {pid}" + ("" if here else f" on {host}")
