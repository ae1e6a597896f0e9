"""``--open``: ``gradscope open PATH`` in a process of its own, so the app follows the
recording live and stays open after the script ends; closing it does not touch the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def open_app(path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gradscope", "open", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # the script's stdout stays the script's alone
        start_new_session=True,
    )
