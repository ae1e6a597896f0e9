"""Debugging one step: the trace timeline, the diagnosis pane, "pause before the optimizer
step" with Apply, and Rewind. Wires those widgets to the window and its run thread; the
engine does the work (trace events, rewind snapshots), this only asks and shows."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QInputDialog, QLabel, QStyle

from gradscope.core.history import Event
from gradscope.core.trace import BACKWARD, TraceEvent, gradients_until, recorded_trace
from gradscope.gui.diagnosis_pane import DiagnosisPane
from gradscope.gui.timeline import TraceCursor, TraceTimeline
from gradscope.gui.worker import RunPaused, RunRewound, StepsFinished


class DebuggerWindow(Protocol):
    """What the step debugger uses of the app's window. The window passes itself; naming
    what is used here keeps this module from importing the window's module, which imports
    this one."""

    history: Any
    _action: Any
    state: Any
    run_thread: Any
    events_dock: Any
    _dock: Any
    _dirty: Any
    tree_model: Any
    settings_trail: Any
    selected_step: Any
    run_paused: Any
    plots: Any
    model_loaded: Any
    loaded: Any
    events_panel: Any
    _origin_shown: Any

    def _set_state(self, *args: Any, **kwargs: Any) -> Any: ...

    def statusBar(self, *args: Any, **kwargs: Any) -> Any: ...

    def tabifyDockWidget(self, *args: Any, **kwargs: Any) -> Any: ...

    def select(self, *args: Any, **kwargs: Any) -> Any: ...

    def addDockWidget(self, *args: Any, **kwargs: Any) -> Any: ...


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


class StepDebugger(QObject):
    """Owns the "Step trace" and "Diagnosis" docks and the Apply/Rewind actions."""

    rewound = Signal(int)  # the step the run went back to (after the window forgot the rest)

    def __init__(self, window: DebuggerWindow) -> None:
        super().__init__(window)
        self.window = window
        self.timeline = TraceTimeline()
        self.diagnosis = DiagnosisPane()
        self.trace_events: list[TraceEvent] = []
        self.flow_override: dict[str, float] | None = None
        self.flow_title: str | None = None
        self.rewind_steps: list[int] = []
        self.snapshot_bytes = 0
        self._origin_shown = None
        self._trace_origin: Any = None  # the recorded origin whose trace the pane shows
        # Given the history a rewind abandons (name, history), to keep it drawn.
        self.on_branch_abandoned: Callable[[str, Any], Any] | None = None

        self.trace_dock = window._dock("Step trace", "trace", self.timeline)
        self.diagnosis_dock = window._dock("Diagnosis", "diagnosis", self.diagnosis)
        window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.trace_dock)
        window.tabifyDockWidget(window.events_dock, self.diagnosis_dock)
        window.events_dock.raise_()
        self.trace_dock.hide()

        sp = QStyle.StandardPixmap
        self.pause_before_apply_action = QAction("Pause &before optimizer step", window)
        self.pause_before_apply_action.setCheckable(True)
        self.pause_before_apply_action.setStatusTip(
            "Stop each step after backward: look at the complete gradients, change clip or "
            "learning rate, then Apply")
        self.pause_before_apply_action.toggled.connect(self._on_pause_before_apply_toggled)
        self.apply_action = window._action(
            "&Apply optimizer step", self.apply, "F11", sp.SP_DialogApplyButton,
            "Apply the optimizer step of the step paused before it")
        self.rewind_action = window._action(
            "Re&wind…", self.ask_rewind, "Ctrl+Z", sp.SP_MediaSeekBackward,
            "Go back to before an earlier step and run again from there")
        self.previous_event_action = window._action(
            "Previous trace event", self.timeline.previous, "Left",
            tip="Walk the traced step backwards")
        self.next_event_action = window._action(
            "Next trace event", self.timeline.next, "Right",
            tip="Walk the traced step: forward pass, then backward")
        self.first_nonfinite_event_action = window._action(
            "First NaN/Inf trace event", self.timeline.jump_to_first_nonfinite, "F",
            tip="Jump to the trace event where a NaN/Inf first appeared")
        self.memory_label = QLabel("")
        self.memory_label.setStyleSheet("padding: 0 8px;")
        window.statusBar().addPermanentWidget(self.memory_label)

        worker = window.run_thread.worker
        worker.steps_finished.connect(self._on_worker_steps_finished)
        worker.run_rewound.connect(self._on_worker_run_rewound)
        window.run_paused.connect(self._on_window_run_paused)
        window.model_loaded.connect(self._on_window_model_loaded)
        self.timeline.event_selected.connect(self._on_timeline_event_selected)
        self.update_actions()

    def install_menus(self, run_menu: Any, view_menu: Any, toolbar: Any) -> None:
        run_menu.addSeparator()
        run_menu.addAction(self.pause_before_apply_action)
        run_menu.addAction(self.apply_action)
        run_menu.addAction(self.rewind_action)
        view_menu.addAction(self.trace_dock.toggleViewAction())
        view_menu.addAction(self.diagnosis_dock.toggleViewAction())
        trace_menu = view_menu.addMenu("&Trace")
        for action in (self.previous_event_action, self.next_event_action,
                       self.first_nonfinite_event_action):
            trace_menu.addAction(action)
        toolbar.insertAction(toolbar.actions()[-2], self.rewind_action)

    # -- commands ----------------------------------------------------------------------
    def apply(self) -> None:
        window = self.window
        if window.state == "before_apply" and window.run_thread.apply_pending():
            window._set_state("running")

    def _live(self) -> bool:
        """A model is loaded and shown (not a recording): Apply and Rewind act on it."""
        window = self.window
        return window.loaded is not None and window.state not in ("recording", "loading",
                                                                  "empty")

    def ask_rewind(self) -> None:
        if not self._live():
            return
        if not self.rewind_steps:
            self.window.statusBar().showMessage(
                "Nothing to rewind to: set Rewind depth in Run settings (it keeps that many "
                "steps)", 8000)
            return
        labels = [f"before step {step}" for step in reversed(self.rewind_steps)]
        choice, ok = QInputDialog.getItem(
            self.window, "Rewind", f"Go back to ({_megabytes(self.snapshot_bytes)} kept):",
            labels, 0, False)
        if ok:
            self.rewind(int(choice.rsplit(" ", 1)[-1]))

    def rewind(self, step: int) -> bool:
        if self.window.state == "running" or not self._live():
            return False
        if self.window.run_thread.rewind(step):
            self.window._set_state("running")
            return True
        return False

    def update_actions(self) -> None:
        state = self.window.state
        live = self._live()
        traced = bool(self.timeline.events)
        self.previous_event_action.setEnabled(traced)
        self.next_event_action.setEnabled(traced)
        self.first_nonfinite_event_action.setEnabled(
            traced and self.timeline.first_nonfinite_button.isEnabled())
        self.apply_action.setEnabled(live and state == "before_apply")
        self.rewind_action.setEnabled(
            live and bool(self.rewind_steps) and state != "running"
            and self.window.history.count > 0  # a failed first step has nothing to undo
        )
        self.memory_label.setText(
            f"rewind: {len(self.rewind_steps)} step(s), {_megabytes(self.snapshot_bytes)}"
            if self.rewind_steps and live else "")

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
        self.window.run_thread.worker.pause_before_apply = checked

    @Slot(object)
    def _on_window_model_loaded(self, _payload: Any) -> None:
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
        window = self.window
        if payload.reason == "before_apply":
            window._set_state("before_apply")
        self.show_origin(window.history.first_nonfinite)
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
        window = self.window
        abandoned = window.history.first_nonfinite
        last = int(window.history.steps[-1]) if window.history.count else payload.step - 1
        # The abandoned branch stays on the plots, drawn as a compared run (its curves
        # disappeared with the rewind).
        branch = copy.deepcopy(window.history) if last >= payload.step else None
        window.history.rewind_to(payload.step)
        if branch is not None and self.on_branch_abandoned is not None:
            self.on_branch_abandoned(f"branch {payload.step}-{last} (rewound)", branch)
        window.settings_trail.rewind(payload.step)
        # The abandoned branch stays told in Events (with its first NaN/Inf, if it had one).
        message = (f"rewound to before step {payload.step}: the abandoned branch ran steps "
                   f"{payload.step}-{last}")
        if abandoned is not None and abandoned.step >= payload.step:
            message += f"; its first NaN/Inf: {abandoned.describe()}"
        else:
            message += "; it had no NaN/Inf"
        window.history.events.append(Event(payload.step, "rewind", None, message))
        window.events_panel.clear()
        window.plots.hide_hover()
        # The traced step and the diagnosis of the abandoned branch are gone with it.
        if self.trace_events and self.trace_events[0].step >= payload.step:
            self.trace_events = []
            self.timeline.set_events([])
        if window.history.first_nonfinite is None:
            window.tree_model.set_origin(None)
            window._origin_shown = False
            self.diagnosis.show_origin(None)
            self._origin_shown = None
        window.selected_step = None
        self.rewind_steps = list(payload.rewind_steps)
        self.snapshot_bytes = payload.snapshot_bytes
        self.flow_override = None
        window._dirty = True
        self.rewound.emit(payload.step)
        self.update_actions()

    @Slot(object)
    def _on_timeline_event_selected(self, cursor: TraceCursor) -> None:
        event = cursor.event
        window = self.window
        if not cursor.walked:
            # A new traced step: the flow chart shows it complete until the user walks it.
            if self.flow_override is not None:
                self.flow_override = None
                window._dirty = True
            return
        if event.phase == BACKWARD:
            self.flow_override = gradients_until(self.trace_events, cursor.index)
            self.flow_title = f"Flow at step {event.step}, event {cursor.index + 1}"
        else:
            self.flow_override = None
        window.select(layer=event.module, step=event.step)
