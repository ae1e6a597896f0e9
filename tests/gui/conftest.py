"""GUI test set-up: headless Qt, throw-away preferences, tiny model scripts, and a check
that no test leaves a QThread running."""

from __future__ import annotations

import gc
import os
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

# Before any Qt import: no display here, and never touch the user's own preferences.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="gradscope-test-config-")
os.environ["GRADSCOPE_RUNS_DIR"] = tempfile.mkdtemp(prefix="gradscope-test-runs-")

import pytest
from PySide6.QtCore import QSettings, QThread

import gradscope.gui  # noqa: F401  (guards against PySide6 6.12.0's None refcount bug)

TINY_MLP = '''
import torch
from torch import nn

CONFIG = {"steps": 5, "batch_size": 4, "device": "cpu"}


def build_model():
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))


def make_batch(batch_size, device):
    return torch.randn(batch_size, 6, device=device), torch.randn(batch_size, 1, device=device)
'''

# log(relu(h)) with a bias that training pushes down: log(0) = -Inf at step 2 (seed 0).
NAN_AT_STEP_2 = '''
import torch
from torch import nn

CONFIG = {"steps": 20, "batch_size": 16, "lr": 0.1, "device": "cpu"}


class LogFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 8)
        nn.init.constant_(self.proj.bias, 1.0)

    def forward(self, h):
        return torch.log(torch.relu(self.proj(h)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.features = LogFeatures()
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.features(self.encoder(x)))


def build_model():
    return Net()


def make_batch(batch_size, device):
    x = torch.randn(batch_size, 16, device=device)
    return x, torch.full((batch_size, 1), -6.0, device=device)
'''

# Each step sleeps, so that a run is reliably in progress when the test acts.
SLOW = '''
import time
import torch
from torch import nn

CONFIG = {"steps": 1000, "batch_size": 2, "device": "cpu"}


class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x):
        time.sleep(0.05)
        return self.fc(x)


def build_model():
    return Slow()


def make_batch(batch_size, device):
    return torch.randn(batch_size, 3, device=device), torch.randn(batch_size, 1, device=device)
'''

BROKEN_BUILD = '''
import torch
from torch import nn


def helper():
    return nn.Linear(3, 1) + 1  # a typo: adding a number to a module


def build_model():
    return helper()
'''

# The forward works for three steps, then the batch no longer fits the model.
FAILS_AT_STEP_3 = '''
import torch
from torch import nn

CONFIG = {"steps": 10, "batch_size": 2, "device": "cpu"}
calls = {"n": 0}


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))


def make_batch(batch_size, device):
    calls["n"] += 1
    width = 4 if calls["n"] <= 3 else 5
    return torch.randn(batch_size, width, device=device), torch.randn(batch_size, 1, device=device)
'''


def write_script(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.fixture
def scripts(tmp_path: Path) -> dict[str, str]:
    return {
        "tiny": write_script(tmp_path, "tiny_mlp.py", TINY_MLP),
        "nan": write_script(tmp_path, "nan_at_step_2.py", NAN_AT_STEP_2),
        "slow": write_script(tmp_path, "slow.py", SLOW),
        "broken": write_script(tmp_path, "broken_build.py", BROKEN_BUILD),
        "fails": write_script(tmp_path, "fails_at_step_3.py", FAILS_AT_STEP_3),
    }


@pytest.fixture(autouse=True)
def no_thread_left_running(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that leaves a QThread running (then stop it, so others are not hurt)."""
    started: list[QThread] = []
    original = QThread.start

    def start(self: QThread, *args: object) -> None:
        started.append(self)
        original(self, *args)

    monkeypatch.setattr(QThread, "start", start)
    yield
    running = []
    for thread in started:
        try:
            if thread.isRunning():
                running.append(thread)
        except RuntimeError:  # the C++ object is gone: it is not running
            continue
    for thread in running:
        thread.quit()
        thread.wait(10_000)
    assert not running, f"{len(running)} QThread(s) left running: {running}"


@pytest.fixture(autouse=True)
def garbage_collection_restored() -> Iterator[None]:
    """The app turns Python's automatic collection off and freezes the heap (see
    gradscope/gui/garbage_collection.py): hand both back after each test, so that later
    tests, GUI or not, run with the collector as Python has it."""
    from gradscope.gui.garbage_collection import stop_collecting

    enabled = gc.isenabled()
    yield
    stop_collecting()
    gc.unfreeze()
    if enabled:
        gc.enable()


@pytest.fixture
def preferences(tmp_path: Path) -> QSettings:
    return QSettings(str(tmp_path / "gradscope.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def window(qtbot, preferences: QSettings):
    from gradscope.gui.app import configure_plots
    from gradscope.gui.main_window import MainWindow

    configure_plots()
    main = MainWindow(preferences)
    qtbot.addWidget(main)
    main.resize(1280, 800)
    main.show()
    yield main
    main.close()


@pytest.fixture(autouse=True)
def _application(qapp):  # every GUI test needs the QApplication (icons, pixmaps)
    return qapp
