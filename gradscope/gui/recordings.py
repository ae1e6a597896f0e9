"""Recordings in the app: every run the app starts is recorded to a per-user folder (so
closing the app or a crash loses nothing), File > Open recording shows one without its model,
and "Follow" keeps a recording that another process is still writing up to date, about
twice a second. The engine's RecordingWriter/RecordingReader do the work. The controller is
given the parts it uses (RecordingParts), not the window, and hands the window what it read
with signals."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyqtgraph as pg
from PySide6.QtCore import QObject, QSettings, QStandardPaths, QTimer, Signal, SignalInstance, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QLabel, QMenu, QStatusBar, QToolBar, QWidget

from gradscope.core.errors import GradScopeError
from gradscope.core.facts import StatisticInfo
from gradscope.core.history import RunHistory
from gradscope.core.module_tree import ModuleTree
from gradscope.core.settings import SETTING_NAMES, RunSettings
from gradscope.core.watch import LayerInfo
from gradscope.gui.dialogs import ErrorDialog
from gradscope.gui.events_panel import EventsPanel
from gradscope.gui.rank_set_view import RankSetView
from gradscope.gui.settings_trail import SettingsTrail
from gradscope.gui.worker import ModelLoaded, StepsFinished

if TYPE_CHECKING:
    from gradscope.core.recording import RecordingReader, RecordingWriter


@dataclass(frozen=True)
class RecordingParts:
    """What the recordings controller is given by whoever shows it (the app's window): where
    it puts its widgets, the signals it records from, and reads of what the window shows now
    (its history and state change with each model or recording). What it asks of the window
    in return goes out as RecordingController's signals."""

    preferences: QSettings
    persist: bool  # remember "Record runs" in the preferences
    status_bar: QStatusBar
    toolbar: QToolBar  # a distributed run's rank selector
    loss_plot: pg.PlotItem  # every rank's loss
    events_panel: EventsPanel  # which rank went non-finite first
    history: Callable[[], RunHistory]  # the history shown now (a followed recording grows it)
    state: Callable[[], str]  # the window's state ("recording" while one is shown)
    model_loaded: SignalInstance  # (ModelLoaded): a new model, a new recording to start
    steps_finished: SignalInstance  # (StepsFinished): the run thread's steps, to record
    rewound: SignalInstance  # (int): the run went back to before this step
    # (text, slot, shortcut=None, icon=None, tip="") -> a QAction of the window, so that its
    # shortcut works wherever the focus is and is listed with the window's
    make_action: Callable[..., QAction]
    dialog_parent: QWidget  # for the file and error dialogs


@dataclass(frozen=True)
class RecordedRun:
    """A recording read, for the window to show (without a model: nothing to run)."""

    tree: ModuleTree
    history: RunHistory
    name: str  # the file's name, shown as the run's
    settings: RunSettings  # the settings it was recorded with


FOLLOW_INTERVAL_MS = 500
RECORDING_HINT = (
    "The app keeps running; what it showed stays on screen. Open another "
    "recording (or an older copy of this one) with File ▸ Open recording."
)
RECENT_RUNS = 12
SUFFIX = ".gsrec"


def runs_folder() -> Path:
    """Where the app records its runs: ``GRADSCOPE_RUNS_DIR`` or the per-user data folder,
    ``<data>/GradScope/runs`` (Qt's AppDataLocation names the organisation and the app,
    both GradScope: ``GradScope/GradScope``)."""
    override = os.environ.get("GRADSCOPE_RUNS_DIR")
    if override:
        return Path(override)
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericDataLocation)
    return (Path(base) / "GradScope" if base else Path.home() / ".gradscope") / "runs"


def recording_stem(source: str) -> str:
    """A file name part for the model a run records: the script's stem, or a model name
    without the characters a file name should not hold (``timm:resnet18`` -> ``timm-resnet18``,
    ``hf:./my/model`` -> ``hf-my-model``)."""
    if source.endswith(".py"):
        return Path(source).stem
    cleaned = "".join(c if c.isalnum() or c in "_-" else "-" for c in source)
    return "-".join(part for part in cleaned.split("-") if part) or "model"


def _settings_of(recorded: dict[str, Any]) -> RunSettings:
    known = {k: v for k, v in recorded.items() if k in SETTING_NAMES}
    try:
        return RunSettings(**known).validated()
    except (TypeError, GradScopeError):
        return RunSettings()


def _flat_tree(history: RunHistory) -> ModuleTree:
    """A recording made without a tree: the root and its watched layers."""
    total = sum(history.layer_params)
    rows = [("", "Model", 0, total)]
    rows += [
        (name, kind, params, params)
        for name, kind, params in zip(
            history.layer_names, history.layer_types, history.layer_params, strict=True
        )
        if name
    ]
    return ModuleTree.from_rows(rows)


class RecordingController(QObject):
    # A recording read (RecordedRun), for the window to show now; the controller then
    # follows it, shows its rank set and emits recording_opened.
    recording_loaded = Signal(object)
    recording_opened = Signal(object)  # Path, once the recording is shown
    # How many new steps follow mode added to the history shown (parts.history()).
    steps_followed = Signal(int)
    error_dialog_opened = Signal(object)  # ErrorDialog: a recording could not be opened

    def __init__(self, parts: RecordingParts, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.parts = parts
        self.preferences = parts.preferences
        self.writer: RecordingWriter | None = None
        # The statistics the writer has been told of (labels, schedules), by name.
        self._described: dict[str, StatisticInfo] = {}
        self.reader: RecordingReader | None = None
        self._layers: tuple[tuple[str, ...], list[LayerInfo]] = ((), [])
        self._settings_trail: SettingsTrail | None = None
        self._to_record: ModelLoaded | None = None  # loaded, recorded from its first step

        self.open_action = parts.make_action(
            "Open &recording…",
            self._on_open_action_triggered,
            "Ctrl+Shift+R",
            tip="Open a GradScope recording (.gsrec) without its model",
        )
        self.record_action = QAction("Record &runs", self)
        self.record_action.setCheckable(True)
        self.record_action.setChecked(
            parts.persist and str(self.preferences.value("recording/enabled", "true")) == "true"
        )
        self.record_action.setStatusTip(f"Record every run to {runs_folder()}")
        self.record_action.toggled.connect(self._on_record_action_toggled)
        self.follow_action = QAction("&Follow recording", self)
        self.follow_action.setCheckable(True)
        self.follow_action.setStatusTip("Keep reading steps another process writes")
        self.follow_action.toggled.connect(self._on_follow_action_toggled)
        self.label = QLabel("")
        self.label.setStyleSheet("padding: 0 8px; color: #555;")
        parts.status_bar.addPermanentWidget(self.label)
        self.follow_timer = QTimer(self)
        self.follow_timer.setInterval(FOLLOW_INTERVAL_MS)
        self.follow_timer.timeout.connect(self._on_follow_timer_timeout)

        self.rank_view = RankSetView(self, parts.toolbar, parts.loss_plot, parts.events_panel)
        self.rank_view.rank_chosen.connect(self._on_rank_view_rank_chosen)
        parts.model_loaded.connect(self._on_window_model_loaded)
        parts.steps_finished.connect(self._on_worker_steps_finished)
        parts.rewound.connect(self._on_debugger_rewound)

    def install_menus(self, file_menu: QMenu, view_menu: QMenu, before: QAction | None) -> None:
        """Open recording, Recent recorded runs and Record runs go into ``file_menu`` above
        ``before`` (at its end for None); Follow recording at the end of ``view_menu``."""
        anchor = before if before in file_menu.actions() else None
        file_menu.insertAction(anchor, self.open_action)
        self.recent_runs_menu = file_menu.addMenu("Recent recorded r&uns")
        file_menu.insertMenu(anchor, self.recent_runs_menu)
        self.recent_runs_menu.aboutToShow.connect(self._fill_recent_runs_menu)
        file_menu.insertAction(anchor, self.record_action)
        view_menu.addAction(self.follow_action)

    # -- recording the app's runs ------------------------------------------------------
    @Slot(object)
    def _on_window_model_loaded(self, payload: ModelLoaded) -> None:
        self._stop_following()
        self.close_writer()
        self.rank_view.clear()
        # The file is made with the first step: opening a model and not running it (every
        # launch does) leaves no empty recording behind.
        self._to_record = payload
        self._settings_trail = SettingsTrail(payload.settings)
        self.label.setText("")

    def _start_writer(self, payload: ModelLoaded) -> None:
        if not self.record_action.isChecked():
            return
        from gradscope.core.recording import RecordingWriter

        folder = runs_folder()
        stem = recording_stem(payload.source)
        path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}{SUFFIX}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self.writer = RecordingWriter(
                path,
                payload.tree,
                payload.settings.to_dict(),
                overwrite=True,
                info={"source": payload.source, "device": payload.device},
            )
        except (OSError, GradScopeError) as error:
            self.parts.status_bar.showMessage(f"not recording this run: {error}", 10000)
            self.writer = None
            return
        self._described = {}
        self._describe_statistics(payload.statistic_infos)
        self.label.setText(f"recording to {path.name}")
        self.label.setToolTip(str(path))

    def _describe_statistics(self, infos: Iterable[StatisticInfo]) -> None:
        """Tell the writer of statistics it does not know yet: the run's named ones are
        read back under their labels (the early warnings' outputs, turned on mid-run too)."""
        new = [info for info in infos if self._described.get(info.name) != info]
        if new and self.writer is not None:
            self.writer.describe_statistics(new)
            self._described.update((info.name, info) for info in new)

    def _layer_infos(
        self, names: tuple[str, ...], types: tuple[str, ...], params: tuple[int, ...]
    ) -> list[LayerInfo]:
        if self._layers[0] != names:
            infos = [LayerInfo(n, t, (), p) for n, t, p in zip(names, types, params, strict=True)]
            self._layers = (names, infos)
        return self._layers[1]

    @Slot(object)
    def _on_worker_steps_finished(self, payload: StepsFinished) -> None:
        if self._to_record is not None and self.parts.state() != "recording":
            loaded, self._to_record = self._to_record, None
            self._start_writer(loaded)
        writer = self.writer
        if writer is None:
            return
        # The window's history took the watch's descriptions of a watch made anew mid-run.
        self._describe_statistics(self.parts.history().statistic_infos.values())
        for record in payload.records:
            result = record.result
            if result.stats is None:
                continue
            layers = self._layer_infos(record.layer_names, record.layer_types, record.layer_params)
            # A settings change (a what-if while paused) is part of the record, at the first
            # step that ran with it.
            trail = self._settings_trail
            change = trail.note(int(result.step), record.settings) if trail else None
            writer.append(
                result.stats,
                layers,
                loss=result.loss,
                origin=result.origin,
                notes=[("settings", change)] if change else (),
            )

    @Slot(int)
    def _on_debugger_rewound(self, step: int) -> None:
        if self.writer is not None:
            self.writer.rewind_to(step)
            if self._settings_trail is not None:
                self._settings_trail.rewind(step)

    def close_writer(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            try:
                writer.close()
            except GradScopeError as error:
                self.parts.status_bar.showMessage(str(error), 10000)
            self.label.setText("")

    def _on_record_action_toggled(self, checked: bool) -> None:
        if self.parts.persist:
            self.preferences.setValue("recording/enabled", "true" if checked else "false")
        if not checked:
            self.close_writer()
            self._to_record = None

    # -- opening and following ---------------------------------------------------------
    def open_recording(self, path: str | os.PathLike[str], rank: int | None = None) -> bool:
        """Read a recording and hand it to the window to show (recording_loaded); follow it
        while a writer is still at it. A rank file of a distributed run (or the set's common
        name) shows the set: the rank named, ``rank``, or for the common name the lowest
        rank's (rank 0's)."""
        from gradscope.core.recording import RecordingReader
        from gradscope.core.recording.rank_set import find_rank_set, load_rank_set
        from gradscope.core.recording.reader import FIRST_VIEW_ROWS

        if self.writer is not None and Path(path).resolve() == self.writer.path.resolve():
            self.close_writer()  # the run it records: everything written before it is read
        rank_set = None
        try:
            recordings = find_rank_set(path)
            if recordings is not None:
                rank_set = load_rank_set(recordings)
                named = Path(path).expanduser()
                by_path = {p.resolve(): r for r, p in recordings.paths.items()}
                if rank is None:
                    rank = by_path.get(named.resolve())
                if rank is None or rank not in recordings.paths:
                    # As `gradscope open` and `report` do: rank 0's (the selector marks the
                    # rank that went non-finite first).
                    rank = recordings.primary_rank
                path = recordings.paths[rank]
            reader = RecordingReader(path)
            try:
                tree, history = reader.load(max_rows=FIRST_VIEW_ROWS)
                # read here too: a damaged writer lock is a dialog, not an error in a slot
                live = reader.is_live()
            except GradScopeError:
                reader.close()
                raise
        except GradScopeError as error:
            dialog = ErrorDialog(
                self.parts.dialog_parent,
                "The recording could not be opened",
                error.message,
                error.details,
                hint=RECORDING_HINT,
            )
            self.error_dialog_opened.emit(dialog)
            dialog.open()
            return False
        self._stop_following()
        self.close_writer()
        self._to_record = None
        self.reader = reader
        if tree is None:
            tree = _flat_tree(history)
        name = Path(path).name
        self.recording_loaded.emit(RecordedRun(tree, history, name, _settings_of(reader.settings)))
        self.follow_action.setChecked(live)
        self.label.setText(f"{'following' if live else 'showing'} {name}")
        self.label.setToolTip(str(path))
        if rank_set is not None and rank is not None:
            self.rank_view.show_set(rank_set, rank)
            self.label.setText(f"{self.label.text()} (rank {rank} of the set)")
        else:
            self.rank_view.clear()
        self.recording_opened.emit(Path(path))
        return True

    def _on_rank_view_rank_chosen(self, rank: int) -> None:
        loaded = self.rank_view.loaded
        if loaded is not None and rank in loaded.recordings.paths:
            self.open_recording(loaded.recordings.paths[rank], rank=rank)

    def _on_follow_action_toggled(self, checked: bool) -> None:
        if checked and self.reader is not None:
            self.follow_timer.start()
        else:
            self.follow_timer.stop()

    def _stop_following(self) -> None:
        self.follow_timer.stop()
        self.follow_action.setChecked(False)
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def _on_follow_timer_timeout(self) -> None:
        reader = self.reader
        if reader is None or self.parts.state() != "recording":
            self.follow_timer.stop()
            return
        try:
            added = reader.read_new_steps(self.parts.history())
        except GradScopeError as error:
            self.parts.status_bar.showMessage(str(error), 10000)
            self.follow_action.setChecked(False)
            return
        self.steps_followed.emit(added)
        if not added and not reader.is_live():
            self.follow_action.setChecked(False)
            self.label.setText(f"showing {reader.path.name} (writer finished)")

    def _on_open_action_triggered(self) -> None:
        folder = runs_folder()
        path, _ = QFileDialog.getOpenFileName(
            self.parts.dialog_parent,
            "Open recording",
            str(folder if folder.exists() else Path.cwd()),
            f"GradScope recordings (*{SUFFIX});;All files (*)",
        )
        if path:
            self.open_recording(path)

    def recent_runs(self) -> list[Path]:
        folder = runs_folder()
        if not folder.is_dir():
            return []
        runs = sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True)
        return runs[:RECENT_RUNS]

    def _fill_recent_runs_menu(self) -> None:
        menu = self.recent_runs_menu
        menu.clear()
        runs = self.recent_runs()
        if not runs:
            menu.addAction("(no recorded runs yet)").setEnabled(False)
        for path in runs:
            menu.addAction(path.name, lambda p=path: self.open_recording(p))

    def close(self) -> None:
        self._stop_following()
        self.close_writer()
