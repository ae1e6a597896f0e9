"""A few checks under a real X server (Xvfb), with real key presses (xdotool): what the
headless tests cannot see, such as the platform's own key bindings of a text field (on X11
Ctrl+E moves a line edit's cursor to the end of the line) and closing the window while a
step goes on.

On a machine where no X server can start these skip, saying why. In CI (``.ci/run``
installs Xvfb, xdotool and libxcb-cursor0 and sets ``GRADSCOPE_REQUIRE_X11=1``) they run,
and fail rather than skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradscope.gui import system_check

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REQUIRED = os.environ.get("GRADSCOPE_REQUIRE_X11") == "1"
TIMEOUT = 90


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"GRADSCOPE_REQUIRE_X11=1 but {reason}")
    pytest.skip(f"no X server for the X11 smoke tests: {reason}")


@pytest.fixture(scope="module")
def x_display() -> Iterator[str]:
    missing = [tool for tool in ("Xvfb", "xdotool") if shutil.which(tool) is None]
    if missing:
        _unavailable(f"{' and '.join(missing)} not installed (apt-get install xvfb xdotool)")
    libraries = system_check.missing_libraries()
    if libraries:
        _unavailable(f"Qt's X11 plugin lacks {', '.join(libraries)}")
    read, write = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
        pass_fds=(write,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    number = b""
    deadline = time.monotonic() + 20
    with os.fdopen(read, "rb") as pipe:
        while time.monotonic() < deadline and not number.endswith(b"\n"):
            chunk = pipe.read(1)
            if not chunk:
                break
            number += chunk
    if not number.strip():
        server.kill()
        server.wait()
        _unavailable("Xvfb did not start")
    try:
        yield f":{number.decode().strip()}"
    finally:
        server.terminate()
        server.wait(10)


class App:
    """The driver process (x11_driver.py) and the keys sent to its window."""

    def __init__(self, display: str, scene: str, model: str, folder: Path) -> None:
        self.display = display
        env = {
            **os.environ,
            "DISPLAY": display,
            "QT_QPA_PLATFORM": "xcb",
            "PYTHONPATH": str(REPO),
            "GRADSCOPE_TEST_FOLDER": str(folder),
            "GRADSCOPE_RUNS_DIR": str(folder / "runs"),
            "XDG_CONFIG_HOME": str(folder / "config"),
        }
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "x11_driver.py"), scene, model],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.window = self.expect("READY").split()[1]

    def expect(self, word: str, timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.lines.append(line.strip())
            if line.startswith(word):
                return line.strip()
        self.process.kill()
        _, errors = self.process.communicate()
        raise AssertionError(f"no {word!r} from the app; it said {self.lines}\n{errors[-3000:]}")

    def keys(self, *arguments: str) -> None:
        env = {**os.environ, "DISPLAY": self.display}
        subprocess.run(
            ["xdotool", "windowfocus", "--sync", self.window], env=env, check=True, timeout=20
        )
        subprocess.run(["xdotool", *arguments], env=env, check=True, timeout=20)

    def close(self) -> int:
        try:
            rest, _ = self.process.communicate(timeout=TIMEOUT)
            self.lines += [line.strip() for line in rest.splitlines()]
            return self.process.returncode
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


def _tiny_model(folder: Path) -> str:
    script = folder / "tiny.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        from torch import nn

        CONFIG = {"steps": 5, "batch_size": 4, "device": "cpu"}


        def build_model():
            return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))


        def make_batch(batch_size, device):
            return torch.randn(batch_size, 6), torch.randn(batch_size, 1)
    """)
    )
    return str(script)


def test_shortcuts_reach_the_app_from_a_focused_text_field(x_display, tmp_path) -> None:
    app = App(x_display, "shortcuts", _tiny_model(tmp_path), tmp_path)
    app.keys("type", "--delay", "30", "0.5")
    app.keys("key", "ctrl+e")
    assert app.expect("EXPORT", 20) == "EXPORT 0.5"
    app.keys("key", "ctrl+z")
    # Rewind asked, and the value typed in the field is still there (not undone).
    assert app.expect("REWIND", 20) == "REWIND 0.5"
    assert app.close() == 0


def test_closing_the_window_mid_step_ends_the_app_at_once(x_display, tmp_path) -> None:
    from test_long_steps import SLOW_MODULES

    script = tmp_path / "slow_modules.py"
    script.write_text(SLOW_MODULES)
    app = App(x_display, "quit", str(script), tmp_path)
    started = time.perf_counter()
    app.keys("key", "ctrl+q")
    closed = float(app.expect("CLOSED", 20).split()[1])
    assert app.close() == 0
    took = time.perf_counter() - started
    assert "EXIT" in app.lines
    # A step takes 2 s (four modules of 0.5 s): it was abandoned, not waited for.
    assert closed < 1.5, closed
    assert took < 6, took
