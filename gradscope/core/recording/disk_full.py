"""Telling a full disk from other write failures, and saying which disk it is.

SQLite reports a full disk as ``sqlite3.OperationalError("database or disk is full")``
(SQLITE_FULL); Python's own writes as ``OSError`` with ``errno.ENOSPC`` (or EDQUOT, a
quota). Either way the recording stops and training goes on: the message names the disk
(its mount point and what is free there) and the file.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from pathlib import Path

_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in _FULL_ERRNOS:
        return True
    if isinstance(error, sqlite3.OperationalError):
        code = getattr(error, "sqlite_errorcode", None)
        return code == sqlite3.SQLITE_FULL or "disk is full" in str(error)
    return False


def mount_point(path: Path) -> Path:
    """The mount point of the file system ``path`` is on (the disk, as a user sees it)."""
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        current = current.parent
    while not os.path.ismount(current) and current != current.parent:
        current = current.parent
    return current


def disk_full_message(path: Path, error: BaseException) -> str:
    """``the disk /data is full (database or disk is full; 12 KiB free)``: the disk
    ``path`` is on, with what the failed write said."""
    disk = mount_point(path)
    try:
        free = f"; {_size(shutil.disk_usage(disk).free)} free"
    except OSError:
        free = ""
    return f"the disk {disk} is full ({error}{free})"


def _size(count: int) -> str:
    size = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
