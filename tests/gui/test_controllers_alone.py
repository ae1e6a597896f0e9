"""The window's controllers work given their parts alone (issue 23): no MainWindow, only the
widgets, signals and reads that their parts dataclass lists, and what they ask of the window
comes out as their signals. Real runs on the run thread, real recordings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyqtgraph as pg
import pytest
import torch
from gui_helpers import LOAD_TIMEOUT, RUN_TIMEOUT
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QStatusBar, QToolBar, QWidget
from torch import nn

import gradscope
from gradscope.core.history import RunHistory
from gradscope.core.trace import BACKWARD
from gradscope.gui.dialogs import ErrorDialog
from gradscope.gui.events_panel import EventsPanel
from gradscope.gui.recordings import RecordedRun, RecordingController, RecordingParts
from gradscope.gui.selection import Selection
from gradscope.gui.step_debugger import DebuggerParts, StepDebugger
from gradscope.gui.worker import LoadRequest, RunThread


class Shown(QObject):
    """Stands in for the window: what it shows, and the signals it emits once it has."""

    model_loaded = Signal(object)
    run_paused = Signal(object)
    steps_finished = Signal(object)
    rewound = Signal(int)

    def __init__(self) -> None:
        super().__init__()
        self.history = RunHistory()
        self.state = "empty"
        self.loaded: Any = None
        self.widget = QWidget()  # the actions' and dialogs' parent

    def make_action(self, text: str, slot: Any, shortcut: Any = None, icon: Any = None,
                    tip: str = "") -> QAction:
        action = QAction(text, self.widget)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.setStatusTip(tip)
        action.triggered.connect(slot)
        return action

    def make_dock(self, title: str, name: str, widget: QWidget) -> QDockWidget:
        dock = QDockWidget(title, self.widget)
        dock.setObjectName(f"{name}_dock")
        dock.setWidget(widget)
        return dock


def test_step_debugger_given_its_parts_walks_a_trace_and_applies(qtbot, scripts) -> None:
    shown = Shown()
    run_thread = RunThread()
    status_bar = QStatusBar()
    debugger = StepDebugger(DebuggerParts(
        run_thread=run_thread,
        status_bar=status_bar,
        history=lambda: shown.history,
        state=lambda: shown.state,
        loaded=lambda: shown.loaded,
        model_loaded=shown.model_loaded,
        run_paused=shown.run_paused,
        make_action=shown.make_action,
        make_dock=shown.make_dock,
        dialog_parent=shown.widget,
    ))
    selections: list[Selection] = []
    states: list[str] = []
    debugger.selection_made.connect(selections.append)
    debugger.state_changed.connect(states.append)

    def on_loaded(payload: Any) -> None:  # what the window does, then tells its views
        run_thread.mark_idle()
        shown.loaded, shown.state = payload, "ready"
        shown.model_loaded.emit(payload)

    def on_paused(payload: Any) -> None:
        run_thread.mark_idle()
        shown.state = "paused"
        shown.run_paused.emit(payload)

    run_thread.worker.model_loaded.connect(on_loaded)
    run_thread.worker.run_paused.connect(on_paused)
    try:
        with qtbot.waitSignal(shown.model_loaded, timeout=LOAD_TIMEOUT):
            run_thread.load(LoadRequest(scripts["tiny"], {"trace": True}))
        assert not debugger.next_event_action.isEnabled()  # nothing traced yet
        debugger.pause_before_apply_action.setChecked(True)
        assert run_thread.worker.pause_before_apply
        with qtbot.waitSignal(shown.run_paused, timeout=RUN_TIMEOUT) as paused:
            assert run_thread.run(1)
        assert paused.args[0].reason == "before_apply"
        # The debugger asks the window for the state; the window sets it.
        assert states == ["before_apply"]
        shown.state = states[-1]
        debugger.update_actions()  # as the window does at each change of state

        # The traced step is walked with the actions, and each backward event is told to
        # the window as a selection (the module and the step).
        events = debugger.timeline.events
        assert events and debugger.next_event_action.isEnabled()
        start = debugger.timeline.index  # the first backward event: nothing walked yet
        assert events[start].phase == BACKWARD and not selections
        while debugger.timeline.index < len(events) - 1:
            debugger.next_event_action.trigger()
        assert selections == [Selection(e.module, e.step) for e in events[start + 1:]]
        assert [s.layer for s in selections if s.layer] == ["2", "1", "0"]
        assert set(debugger.flow_override or {}) == {"0", "2"}

        # Apply: the pending optimizer step is applied and the window is told it runs.
        assert debugger.apply_action.isEnabled()
        with qtbot.waitSignal(shown.run_paused, timeout=RUN_TIMEOUT):
            debugger.apply_action.trigger()
        assert states[1] == "running"
        assert run_thread.worker.runner.pending_step is None
        assert run_thread.worker.runner.step_index == 1
    finally:
        run_thread.shutdown()


def _record(path: Path, steps: int) -> list[float]:
    """A real recording of a tiny model's training, as a user's own loop writes one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    with gradscope.watch(model, record=str(path)) as watch:
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1))
            loss.backward()
            watch.collect(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def test_recordings_given_its_parts_open_a_recording(qtbot, preferences, tmp_path) -> None:
    path = tmp_path / "run.gsrec"
    losses = _record(path, steps=6)
    shown = Shown()
    status_bar = QStatusBar()
    controller = RecordingController(RecordingParts(
        preferences=preferences,
        persist=False,
        status_bar=status_bar,
        toolbar=QToolBar(),
        loss_plot=pg.PlotItem(),
        events_panel=EventsPanel(),
        history=lambda: shown.history,
        state=lambda: shown.state,
        model_loaded=shown.model_loaded,
        steps_finished=shown.steps_finished,
        rewound=shown.rewound,
        make_action=shown.make_action,
        dialog_parent=shown.widget,
    ))
    runs: list[RecordedRun] = []

    def show(run: RecordedRun) -> None:  # what the window does with a recording read
        runs.append(run)
        shown.history, shown.state = run.history, "recording"

    controller.recording_loaded.connect(show)
    try:
        with qtbot.waitSignal(controller.recording_opened, timeout=10_000) as opened:
            assert controller.open_recording(path)
        assert opened.args == [path]
        (run,) = runs
        assert run.name == "run.gsrec" and run.history.count == 6
        assert list(run.history.losses) == pytest.approx(losses, rel=1e-6)
        assert run.history.layer_names == ["0", "2"]
        assert [node.name for node in run.tree] == ["", "0", "1", "2"]
        assert shown.history is run.history
        # The writer closed its file: nothing to follow.
        assert not controller.follow_action.isChecked() and controller.reader is not None
        assert controller.label.text() == "showing run.gsrec"

        # A file that is no recording: the error dialog is handed to the window.
        bad = tmp_path / "bad.gsrec"
        bad.write_text("not a recording")
        with qtbot.waitSignal(controller.error_dialog_opened, timeout=10_000) as failed:
            assert not controller.open_recording(bad)
        dialog = failed.args[0]
        assert isinstance(dialog, ErrorDialog) and dialog.isVisible()
        dialog.close()
        assert len(runs) == 1 and controller.reader is not None  # the recording shown stays
    finally:
        controller.close()
