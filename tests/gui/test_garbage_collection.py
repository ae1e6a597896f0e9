"""Garbage is collected on the GUI thread only: a collection in the run thread destroys Qt
objects there, on the wrong thread, and froze the app (and CI) in a deadlock."""

from __future__ import annotations

import gc
import textwrap
import threading
from pathlib import Path

from gui_helpers import open_and_wait, run_and_wait
from PySide6.QtCore import QObject, Qt

from gradscope.gui.garbage_collection import collect_on_gui_thread

# Every forward makes thousands of reference cycles: with automatic collection on, the run
# thread would pass the collector's threshold many times per step.
CYCLES = '''
import torch
from torch import nn

CONFIG = {"steps": 12, "batch_size": 4, "device": "cpu"}


class MakesCycles(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        for _ in range(5000):
            node = {}
            node["self"] = node
        return self.fc(x)


def build_model():
    return MakesCycles()


def make_batch(batch_size, device):
    return torch.randn(batch_size, 4), torch.randn(batch_size, 1)
'''


def test_garbage_is_collected_on_the_gui_thread_only(qtbot, window, tmp_path: Path) -> None:
    script = tmp_path / "makes_cycles.py"
    script.write_text(textwrap.dedent(CYCLES))
    gui_thread = threading.get_ident()
    collecting_threads: set[int] = set()
    destroyed_on: list[int] = []

    def on_collection(phase: str, info: dict) -> None:
        if phase == "start":
            collecting_threads.add(threading.get_ident())

    # A Qt object in a reference cycle, made on the GUI thread: it must be freed there.
    doomed = QObject()
    doomed.cycle = doomed
    doomed.destroyed.connect(
        lambda: destroyed_on.append(threading.get_ident()), Qt.ConnectionType.DirectConnection
    )
    del doomed
    collector = window.garbage_collector
    before = sum(collector.collections)
    gc.callbacks.append(on_collection)
    try:
        open_and_wait(qtbot, window, str(script))
        paused = run_and_wait(qtbot, window, window.run)
        qtbot.waitUntil(lambda: bool(destroyed_on), timeout=5000)
        # The run's cycles are collected by the GUI thread's timer (within its 250 ms),
        # maybe after the run ended: a fast run can end before its first tick.
        qtbot.waitUntil(lambda: sum(collector.collections) > before, timeout=5000)
    finally:
        gc.callbacks.remove(on_collection)
    assert paused.reason == "completed" and window.history.count == 12
    assert collecting_threads == {gui_thread}  # nothing collected in the run thread
    assert destroyed_on == [gui_thread]
    assert not gc.isenabled()


def test_the_collector_takes_automatic_collection_back(qtbot, window) -> None:
    collector = window.garbage_collector
    assert collect_on_gui_thread() is collector  # one per application
    gc.enable()  # e.g. a user's script turns it back on
    qtbot.waitUntil(lambda: not gc.isenabled(), timeout=2000)


def test_settle_sets_survivors_aside_and_frees_them_once_they_are_garbage(qtbot, window) -> None:
    collector = window.garbage_collector
    destroyed: list[bool] = []
    holder = QObject()
    holder.cycle = holder
    holder.destroyed.connect(lambda: destroyed.append(True), Qt.ConnectionType.DirectConnection)
    collector.settle()  # alive now: set aside (frozen)
    assert gc.get_freeze_count() > 0
    del holder
    gc.collect()  # collections skip what settle set aside...
    assert not destroyed
    collector.settle()  # ...and the next settle looks at it again
    assert destroyed == [True]


def test_a_model_load_settles_the_heap(qtbot, window, scripts) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    open_and_wait(qtbot, window, scripts["tiny"])
    assert gc.get_freeze_count() > 0


# The next two run in this order: the first leaves the app's collector as a window leaves it,
# the second checks that the GUI fixtures handed garbage collection back (issue 16).
def test_a_window_turns_collection_off_and_freezes_the_heap(qtbot, window) -> None:
    window.garbage_collector.settle()
    assert not gc.isenabled() and gc.get_freeze_count() > 0


def test_the_next_test_gets_collection_back(qtbot) -> None:
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    qtbot.wait(600)  # the collector's timer (250 ms) would turn it off again if still running
    assert gc.isenabled()
