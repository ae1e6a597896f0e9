"""Debugging one step: the trace timeline, the diagnosis pane, "pause before the optimizer
step" with Apply, and Rewind. Given the parts it uses (the run thread, the status bar, the
window's signals and reads of what it shows: DebuggerParts), not the window, and tells the
window what to do with signals; the engine does the work (trace events, rewind snapshots),
this only asks and shows."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, SignalInstance, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QDockWidget,
    QInputDialog,
    QLabel,
    QMainWindow,
    QStatusBar,
    QStyle,
    QWidget,
)

from gradscope.core.history import Event, RunHistory
from gradscope.core.trace import BACKWARD, TraceEvent, gradients_until, recorded_trace
from gradscope.gui.diagnosis_pane import DiagnosisPane
from gradscope.gui.selection import Selection
from gradscope.gui.timeline import TraceCursor, TraceTimeline
from gradscope.gui.worker import ModelLoaded, RunPaused, RunRewound, RunThread, StepsFinished


@dataclass(frozen=True)
class DebuggerParts:
    """What the step debugger is given by whoever shows it (the app's window): the run thread
    it asks to apply and rewind, the status bar it writes to, the signals it listens to, and
    reads of what the window shows now (its history and state change with each model or
    recording). What it asks of the window in return goes out as StepDebugger's signals."""

    run_thread: RunThread
    status_bar: QStatusBar
    history: Callable[[], RunHistory]  # the history shown now
    state: Callable[[], str]  # the window's state ("ready", "running", "before_apply", ...)
    loaded: Callable[[], ModelLoaded | None]  # the live model shown, None for a recording
    model_loaded: SignalInstance  # (ModelLoaded), after the window has shown the model
    run_paused: SignalInstance  # (RunPaused), after the window has taken the pause in
    # (text, slot, shortcut=None, icon=None, tip="") -> a QAction of the window, so that its
    # shortcut works wherever the focus is and is listed with the window's
    make_action: Callable[..., QAction]
    make_dock: Callable[[str, str, QWidget], QDockWidget]  # (title, name, widget)
    dialog_parent: QWidget  # for the Rewind dialog


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


class StepDebugger(QObject):
    """Owns the "Step trace" and "Diagnosis" docks and the Apply/Rewind actions. Given its
    parts (DebuggerParts), not the window; what it asks of the window goes out as signals."""

    # The step the run went back to, after the debugger rewound the history shown (the
    # window forgets its own state of the abandoned branch: selection, origin shown).
    rewound = Signal(int)
    # The history a rewind abandoned, to keep it drawn as a compared run: (name, RunHistory).
    branch_abandoned = Signal(str, object)
    state_changed = Signal(str)  # the run went to this state: Apply/Rewind ran it, or it paused
    selection_made = Signal(object)  # Selection: the walked trace event's module and step
    flow_changed = Signal()  # flow_override/flow_title changed: the flow chart is to redraw

    def __init__(self, parts: DebuggerParts, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.parts = parts
        self.timeline = TraceTimeline()
        self.diagnosis = DiagnosisPane()
        self.trace_events: list[TraceEvent] = []
        self.flow_override: dict[str, float] | None = None
        self.flow_title: str | None = None
        self.rewind_steps: list[int] = []
        self.snapshot_bytes = 0
        self._origin_shown = None
        self._trace_origin: Any = None  # the recorded origin whose trace the pane shows

        self.trace_dock = parts.make_dock("Step trace", "trace", self.timeline)
        self.diagnosis_dock = parts.make_dock("Diagnosis", "diagnosis", self.diagnosis)
        self.trace_dock.hide()

        sp = QStyle.StandardPixmap
        make_action = parts.make_action
        self.pause_before_apply_action = QAction("Pause &before optimizer step", self)
        self.pause_before_apply_action.setCheckable(True)
        self.pause_before_apply_action.setStatusTip(
            "Stop each step after backward: look at the complete gradients, change clip or "
            "learning rate, then Apply"
        )
        self.pause_before_apply_action.toggled.connect(self._on_pause_before_apply_toggled)
        self.apply_action = make_action(
            "&Apply optimizer step",
            self.apply,
            "F11",
            sp.SP_DialogApplyButton,
            "Apply the optimizer step of the step paused before it",
        )
        self.rewind_action = make_action(
            "Re&wind…",
            self.ask_rewind,
            "Ctrl+Z",
            sp.SP_MediaSeekBackward,
            "Go back to before an earlier step and run again from there",
        )
        self.previous_event_action = make_action(
            "Previous trace event",
            self.timeline.previous,
            "Left",
            tip="Walk the traced step backwards",
        )
        self.next_event_action = make_action(
            "Next trace event",
            self.timeline.next,
            "Right",
            tip="Walk the traced step: forward pass, then backward",
        )
        self.first_nonfinite_event_action = make_action(
            "First NaN/Inf trace event",
            self.timeline.jump_to_first_nonfinite,
            "F",
            tip="Jump to the trace event where a NaN/Inf first appeared",
        )
        self.memory_label = QLabel("")
        self.memory_label.setStyleSheet("padding: 0 8px;")
        parts.status_bar.addPermanentWidget(self.memory_label)

        worker = parts.run_thread.worker
        worker.steps_finished.connect(self._on_worker_steps_finished)
        worker.run_rewound.connect(self._on_worker_run_rewound)
        parts.run_paused.connect(self._on_window_run_paused)
        parts.model_loaded.connect(self._on_window_model_loaded)
        self.timeline.event_selected.connect(self._on_timeline_event_selected)
        self.update_actions()

    def install_docks(self, window: QMainWindow, beside: QDockWidget) -> None:
        """The Step trace under the plots; Diagnosis a tab of ``beside`` (Events), which
        stays in front."""
        window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.trace_dock)
        window.tabifyDockWidget(beside, self.diagnosis_dock)
        beside.raise_()

    def install_menus(self, run_menu: Any, view_menu: Any, toolbar: Any) -> None:
        run_menu.addSeparator()
        run_menu.addAction(self.pause_before_apply_action)
        run_menu.addAction(self.apply_action)
        run_menu.addAction(self.rewind_action)
        view_menu.addAction(self.trace_dock.toggleViewAction())
        view_menu.addAction(self.diagnosis_dock.toggleViewAction())
        trace_menu = view_menu.addMenu("&Trace")
        for action in (
            self.previous_event_action,
            self.next_event_action,
            self.first_nonfinite_event_action,
        ):
            trace_menu.addAction(action)
        toolbar.insertAction(toolbar.actions()[-2], self.rewind_action)

    # -- commands ----------------------------------------------------------------------
    def apply(self) -> None:
        if self.parts.state() == "before_apply" and self.parts.run_thread.apply_pending():
            self.state_changed.emit("running")

    def _live(self) -> bool:
        """A model is loaded and shown (not a recording): Apply and Rewind act on it."""
        return self.parts.loaded() is not None and self.parts.state() not in (
            "recording",
            "loading",
            "empty",
        )

    def ask_rewind(self) -> None:
        if not self._live():
            return
        if not self.rewind_steps:
            self.parts.status_bar.showMessage(
                "Nothing to rewind to: set Rewind depth in Run settings (it keeps that many steps)",
                8000,
            )
            return
        labels = [f"before step {step}" for step in reversed(self.rewind_steps)]
        choice, ok = QInputDialog.getItem(
            self.parts.dialog_parent,
            "Rewind",
            f"Go back to ({_megabytes(self.snapshot_bytes)} kept):",
            labels,
            0,
            False,
        )
        if ok:
            self.rewind(int(choice.rsplit(" ", 1)[-1]))

    def rewind(self, step: int) -> bool:
        if self.parts.state() == "running" or not self._live():
            return False
        if self.parts.run_thread.rewind(step):
            self.state_changed.emit("running")
            return True
        return False

    def update_actions(self) -> None:
        state = self.parts.state()
        live = self._live()
        traced = bool(self.timeline.events)
        self.previous_event_action.setEnabled(traced)
        self.next_event_action.setEnabled(traced)
        self.first_nonfinite_event_action.setEnabled(
            traced and self.timeline.first_nonfinite_button.isEnabled()
        )
        self.apply_action.setEnabled(live and state == "before_apply")
        self.rewind_action.setEnabled(
            live
            and bool(self.rewind_steps)
            and state != "running"
            and self.parts.history().count > 0  # a failed first step has nothing to undo
        )
        self.memory_label.setText(
            f"rewind: {len(self.rewind_steps)} step(s), {_megabytes(self.snapshot_bytes)}"
            if self.rewind_steps and live
            else ""
        )

    def follow_trace_setting(self, trace: bool) -> None:
        """Trace mode off: the Step trace pane goes (it stayed docked, empty); it comes back
        with the next traced step. A pane that shows a step (a recording's failing step)
        stays."""
        if not trace and self.trace_dock.isVisible() and not self.trace_events:
            self.trace_dock.hide()

    def show_recording(self, origin: Any) -> None:
        """A recording replaced the live model: no rewind, its own origin, and the failing
        step's trace it keeps with that origin (walkable as a traced step)."""
        self.trace_events = []
        self.timeline.set_events([])
        self.flow_override = None
        self.rewind_steps, self.snapshot_bytes = [], 0
        self.diagnosis.show_origin(origin)
        self._origin_shown = origin
        self._trace_origin = None
        self.show_recorded_trace(origin)
        self.update_actions()

    def show_recorded_trace(self, origin: Any) -> None:
        """Feed the Step trace pane the failing step a recording keeps with ``origin``
        (also when it first appears while the recording is followed live)."""
        if origin is None or origin is self._trace_origin:
            return
        events = recorded_trace(origin)
        if not events:
            return
        self._trace_origin = origin
        self.trace_events = events
        self.timeline.set_events(events)
        if not self.trace_dock.isVisible():
            self.trace_dock.show()
        self.update_actions()

    # -- events ------------------------------------------------------------------------
    def _on_pause_before_apply_toggled(self, checked: bool) -> None:
        self.parts.run_thread.worker.pause_before_apply = checked

    @Slot(object)
    def _on_window_model_loaded(self, _payload: ModelLoaded) -> None:
        self.trace_events = []
        self.timeline.set_events([])
        self.flow_override = None
        self.rewind_steps, self.snapshot_bytes = [], 0
        self.diagnosis.show_origin(None)
        self._origin_shown = None
        self.update_actions()

    @Slot(object)
    def _on_worker_steps_finished(self, payload: StepsFinished) -> None:
        traced = [r.result.trace for r in payload.records if r.result.trace is not None]
        if traced:
            self.trace_events = traced[-1]
            self.timeline.set_events(self.trace_events)
            if not self.trace_dock.isVisible():
                self.trace_dock.show()
            self.update_actions()

    @Slot(object)
    def _on_window_run_paused(self, payload: RunPaused) -> None:
        self.rewind_steps = list(payload.rewind_steps)
        self.snapshot_bytes = payload.snapshot_bytes
        if payload.reason == "before_apply":
            self.state_changed.emit("before_apply")
        self.show_origin(self.parts.history().first_nonfinite)
        self.update_actions()

    def show_origin(self, origin: Any) -> None:
        """Diagnose a first NaN/Inf the window has not diagnosed yet, wherever it came from:
        a paused run, or a recording being followed (whatever the origin's phase)."""
        if origin is not None and origin is not self._origin_shown:
            self._origin_shown = origin
            self.diagnosis.show_origin(origin)
            self.diagnosis_dock.show()
            self.diagnosis_dock.raise_()

    @Slot(object)
    def _on_worker_run_rewound(self, payload: RunRewound) -> None:
        history = self.parts.history()
        abandoned = history.first_nonfinite
        last = int(history.steps[-1]) if history.count else payload.step - 1
        # The abandoned branch stays on the plots, drawn as a compared run (its curves
        # disappeared with the rewind).
        branch = copy.deepcopy(history) if last >= payload.step else None
        history.rewind_to(payload.step)
        if branch is not None:
            self.branch_abandoned.emit(f"branch {payload.step}-{last} (rewound)", branch)
        # The abandoned branch stays told in Events (with its first NaN/Inf, if it had one).
        message = (
            f"rewound to before step {payload.step}: the abandoned branch ran steps "
            f"{payload.step}-{last}"
        )
        if abandoned is not None and abandoned.step >= payload.step:
            message += f"; its first NaN/Inf: {abandoned.describe()}"
        else:
            message += "; it had no NaN/Inf"
        history.events.append(Event(payload.step, "rewind", None, message))
        # The traced step and the diagnosis of the abandoned branch are gone with it.
        if self.trace_events and self.trace_events[0].step >= payload.step:
            self.trace_events = []
            self.timeline.set_events([])
        if history.first_nonfinite is None:
            self.diagnosis.show_origin(None)
            self._origin_shown = None
        self.rewind_steps = list(payload.rewind_steps)
        self.snapshot_bytes = payload.snapshot_bytes
        self.flow_override = None
        self.rewound.emit(payload.step)
        self.update_actions()

    @Slot(object)
    def _on_timeline_event_selected(self, cursor: TraceCursor) -> None:
        event = cursor.event
        if not cursor.walked:
            # A new traced step: the flow chart shows it complete until the user walks it.
            if self.flow_override is not None:
                self.flow_override = None
                self.flow_changed.emit()
            return
        if event.phase == BACKWARD:
            self.flow_override = gradients_until(self.trace_events, cursor.index)
            self.flow_title = f"Flow at step {event.step}, event {cursor.index + 1}"
        else:
            self.flow_override = None
        self.selection_made.emit(Selection(event.module, event.step))
