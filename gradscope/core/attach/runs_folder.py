"""The per-user folder recordings go to when no path is given: the one the app records its
own runs to (Qt's application data folder for GradScope), found without Qt."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

_APP = Path("GradScope") / "GradScope"  # Qt's organisation and application names


def runs_folder() -> Path:
    """``GRADSCOPE_RUNS_DIR``, or the app's ``runs`` folder in the per-user data folder."""
    override = os.environ.get("GRADSCOPE_RUNS_DIR")
    if override:
        return Path(override).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / _APP / "runs"


def default_recording_path(script: str) -> Path:
    """``<runs folder>/<date-time>-<script>.gsrec``. Under torchrun every rank must pick the
    same name (each then writes its ``.rank<N>`` file): the name holds the run's id (or the
    launcher's process id) and the date, not the second each rank started at."""
    stem = Path(script).stem or "script"
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if "LOCAL_RANK" in os.environ:
        tag = run_id if run_id and run_id != "none" else f"p{os.getppid()}"
        return runs_folder() / f"{time.strftime('%Y%m%d')}-{stem}-{tag}.gsrec"
    return runs_folder() / f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}.gsrec"
