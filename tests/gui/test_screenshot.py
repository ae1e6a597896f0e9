"""``gradscope MODEL --steps N --screenshot PATH.png`` as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtGui import QImage


def run_app(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "config"),
               GRADSCOPE_WINDOW_SIZE="1280x800")
    return subprocess.run([sys.executable, "-m", "gradscope", *args], env=env,
                          capture_output=True, text=True, timeout=180)


def test_screenshot_option_writes_an_image_of_the_window(tmp_path: Path, scripts) -> None:
    shot = tmp_path / "shot.png"
    result = run_app([scripts["nan"], "--steps", "10", "--screenshot", str(shot)], tmp_path)
    assert result.returncode == 0, result.stderr
    image = QImage(str(shot))
    assert (image.width(), image.height()) == (1280, 800)
    # The run paused itself at the NaN (step 2): the status bar's red text is on screen, and
    # the picture is not blank.
    colors = {image.pixel(x, y) for x in range(0, 1280, 16) for y in range(0, 800, 16)}
    assert len(colors) > 20
    # Scripted runs leave the user's preferences alone.
    assert not (tmp_path / "config" / "GradScope").exists()


def test_screenshot_of_a_broken_script_exits_with_an_error(tmp_path: Path, scripts) -> None:
    shot = tmp_path / "shot.png"
    result = run_app([scripts["broken"], "--screenshot", str(shot)], tmp_path)
    assert result.returncode == 2
    assert shot.exists()
