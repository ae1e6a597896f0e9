"""Runs compared on the same axes: File > Add recording to compare (and ``gradscope open
A.gsrec B.gsrec``) reads other recordings and hands them to the plots, each with its own
line style. Given the widgets and callbacks it uses, not the window, so that it needs
nothing of the window's module."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QWidget

from gradscope.core.errors import GradScopeError
from gradscope.core.history import RunHistory
from gradscope.gui.dialogs import ErrorDialog
from gradscope.gui.plots.compared_runs import COMPARED_LINE_STYLES, ComparedRun

if TYPE_CHECKING:  # read lazily: the recording module is not needed to start the app
    from gradscope.core.recording import RecordingReader

FOLLOW_INTERVAL_MS = 500  # as the shown recording is followed
SUFFIX = ".gsrec"


class RunComparison(QObject):
    """The compared runs; ``runs_changed`` when one is added or they are cleared."""

    runs_changed = Signal()
    # A followed compared run read new steps (the plots redraw; the step range the user
    # zoomed to stays, as it does while the shown recording is followed).
    runs_grew = Signal()

    def __init__(
        self, parent: QWidget, start_folder: Callable[[], Path], show_message: Callable[[str], None]
    ) -> None:
        super().__init__(parent)
        self._parent = parent
        self._start_folder = start_folder
        self._show_message = show_message
        self.runs: tuple[ComparedRun, ...] = ()
        self.error_dialog: ErrorDialog | None = None
        self.add_action = QAction("Add recording to &compare…", parent)
        self.add_action.setStatusTip(
            "Draw another recording's curves on the same axes (layers matched by name)"
        )
        self.add_action.triggered.connect(self._on_add_action_triggered)
        self.clear_action = QAction("Clear compared runs", parent)
        self.clear_action.setEnabled(False)
        self.clear_action.triggered.connect(self.clear)
        self.pin_action = QAction("&Keep compared runs when another model opens", parent)
        self.pin_action.setCheckable(True)
        self.pin_action.setStatusTip(
            "Compared runs and rewound branches belong to the model they were made on; "
            "tick this to compare them with the next model too"
        )
        self.shown: str | None = None  # what the window shows, as model_shown was told
        # A compared recording that a writer is still at is followed like the shown one
        # (it stayed at its first 44 steps while its writer reached 300): run name -> reader.
        self.followed: dict[str, RecordingReader] = {}
        self.follow_timer = QTimer(self)
        self.follow_timer.setInterval(FOLLOW_INTERVAL_MS)
        self.follow_timer.timeout.connect(self._on_follow_timer_timeout)

    def add_recording(self, path: str | os.PathLike[str]) -> bool:
        """Read ``path`` and compare it; a file that is no recording says why and changes
        nothing."""
        from gradscope.core.recording import RecordingReader
        from gradscope.core.recording.reader import FIRST_VIEW_ROWS

        reader = None
        try:
            reader = RecordingReader(path)
            _, history = reader.load(max_rows=FIRST_VIEW_ROWS)
            live = reader.is_live()
        except GradScopeError as error:
            if reader is not None:
                reader.close()
            self.error_dialog = ErrorDialog(
                self._parent, "The recording could not be compared", error.message, error.details
            )
            self.error_dialog.open()
            return False
        run = self.add_run(Path(path).name, history)
        if live:
            self.followed[run.name] = reader
            self.follow_timer.start()
            self._show_message(f"comparing with {run.name}, following its writer")
        else:
            reader.close()
        return True

    def _on_follow_timer_timeout(self) -> None:
        added = 0
        for run in self.runs:
            reader = self.followed.get(run.name)
            if reader is None:
                continue
            try:
                added += reader.read_new_steps(run.history)
                live = reader.is_live()
            except GradScopeError as error:
                self._show_message(f"{run.name}: {error.message}")
                live = False
            if not live:  # the writer finished (or failed): what it wrote is all there is
                reader.close()
                del self.followed[run.name]
        if not self.followed:
            self.follow_timer.stop()
        if added:
            self.runs_grew.emit()

    def _stop_following(self, kept: tuple[ComparedRun, ...] = ()) -> None:
        names = {run.name for run in kept}
        for name in [n for n in self.followed if n not in names]:
            self.followed.pop(name).close()
        if not self.followed:
            self.follow_timer.stop()

    def add_run(self, name: str, history: RunHistory) -> ComparedRun:
        """Compare ``history`` (a recording read, or the branch a rewind abandoned) under
        ``name`` (made unique), in the next line style."""
        taken = {run.name for run in self.runs}
        unique, suffix = name, 2
        while unique in taken:  # the same file twice, or two runs' files of one name
            unique = f"{name} ({suffix})"
            suffix += 1
        style = COMPARED_LINE_STYLES[len(self.runs) % len(COMPARED_LINE_STYLES)]
        run = ComparedRun(unique, history, style, made_on=self.shown)
        self.runs = (*self.runs, run)
        self.clear_action.setEnabled(True)
        self._show_message(f"comparing with {unique} ({history.count} steps)")
        self.runs_changed.emit()
        return run

    def model_shown(self, key: str) -> None:
        """The window now shows ``key`` (a model's source, a recording's path). Runs made
        on another model leave (a rewound branch, a recording of another model's layers
        drawn beside this one's namesakes), unless the user pinned them."""
        self.shown = key
        if self.pin_action.isChecked():
            return
        kept = tuple(run for run in self.runs if run.made_on == key)
        if len(kept) != len(self.runs):
            self._stop_following(kept)
            self.runs = kept
            self.clear_action.setEnabled(bool(kept))
            self.runs_changed.emit()

    def clear(self) -> None:
        if self.runs:
            self._stop_following()
            self.runs = ()
            self._show_message("compared runs cleared")  # not "comparing with ..." still
            self.clear_action.setEnabled(False)
            self.runs_changed.emit()

    def _on_add_action_triggered(self) -> None:
        folder = self._start_folder()
        path, _ = QFileDialog.getOpenFileName(
            self._parent,
            "Add recording to compare",
            str(folder if folder.exists() else Path.cwd()),
            f"GradScope recordings (*{SUFFIX});;All files (*)",
        )
        if path:
            self.add_recording(path)
