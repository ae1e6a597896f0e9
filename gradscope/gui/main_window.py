"""The main window: menus, toolbar, docks (layers, run settings, events), the plots and the
status bar. It owns the run thread and the GUI-side RunHistory, and only displays what the
engine measured."""

from __future__ import annotations

import csv
import html
import json
import re
import time
from collections import deque
from itertools import groupby
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QPoint, QRect, QSettings, Qt, QTimer, Signal, Slot
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QColor,
    QDesktopServices,
    QDragEnterEvent,
    QDropEvent,
    QKeySequence,
    QPainter,
    QPalette,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMenu,
    QStyle,
    QTabWidget,
    QToolBar,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from gradscope.core.facts import EarlyWarning
from gradscope.core.history import MISSING, STATUS_MISSING, Event, RunHistory
from gradscope.core.settings import SETTING_NAMES, RunSettings
from gradscope.gui import shortcuts
from gradscope.gui.dialogs import ErrorDialog, ModelDialog, show_about
from gradscope.gui.events_panel import EventsPanel
from gradscope.gui.garbage_collection import collect_on_gui_thread
from gradscope.gui.help_links import app_section_url
from gradscope.gui.layer_tree_actions import LayerTreeActions
from gradscope.gui.mixed_precision import PrecisionSummary
from gradscope.gui.module_tree_model import (
    GRAD_NORM,
    NAME,
    NAME_ROLE,
    PARAMS,
    STATUS,
    TYPE,
    ModuleFilterModel,
    ModuleTreeModel,
)
from gradscope.gui.plots import PlotPanel, PlotView, layer_color
from gradscope.gui.plots.statistic_choice import STATISTIC_LABELS
from gradscope.gui.plots.warning_guides import QUANTITY_STATISTICS
from gradscope.gui.recordings import RecordedRun, RecordingController, RecordingParts, runs_folder
from gradscope.gui.run_comparison import RunComparison
from gradscope.gui.selection import Selection
from gradscope.gui.settings_panel import SettingsPanel, cuda_devices
from gradscope.gui.settings_trail import SettingsTrail
from gradscope.gui.status_style import STATUS_COLORS, format_value
from gradscope.gui.step_debugger import DebuggerParts, StepDebugger
from gradscope.gui.window_geometry import fit_to_screen
from gradscope.gui.worker import (
    LoadRequest,
    ModelLoaded,
    RunFailed,
    RunPaused,
    RunThread,
    StepsFinished,
    WatchChanged,
)

# The app's own defaults, under a script's CONFIG and what the user set: the update ratio on
# and the last steps kept for Rewind (headless runs default both off, for speed and memory).
APP_DEFAULTS = {"update_ratio": True, "rewind_depth": 5}
# Torchvision models in the app without a GPU: an image size and batch that keep a step of a
# big model in seconds, not minutes (the loader raises the size to what a model needs, e.g.
# 224 for the vision transformers). Shown, and changeable, in Run settings.
CPU_TORCHVISION_DEFAULTS = {"image_size": 64, "batch_size": 4}
REFRESH_INTERVAL_MS = 33  # about 30 Hz: plots never redraw faster than this
# At most this share of the GUI thread's time goes to redrawing (refresh and paint): a sixth
# when idle; while a run goes on, less, because the GUI thread then takes the GIL from the
# training loop (issue 6: the app must keep 90% of a headless run's steps per second).
IDLE_REDRAW_SHARE = 1 / 6
RUNNING_REDRAW_SHARE = 0.04
RECENT_LIMIT = 10
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "sample_models"
_STATE_TEXT = {
    "empty": ("No model", "#666"),
    "loading": ("Loading…", "#666"),
    "ready": ("Ready", "#2c7a2c"),
    "running": ("Running", "#1f5fb4"),
    "paused": ("Paused", "#a05a00"),
    "halted": ("Paused at NaN/Inf", "#c00000"),
    "before_apply": ("Paused before optimizer step", "#a05a00"),
    "recording": ("Recording (read-only)", "#444"),
    "done": ("Finished", "#2c7a2c"),
    "stopped": ("Stopped", "#666"),
    "pausing": ("Pausing after this step…", "#a05a00"),
    "stopping": ("Stopping: the step going on is abandoned…", "#666"),
    "failed": ("Error", "#c00000"),
    "step_failed": ("Step failed", "#c00000"),
}


class MainWindow(QMainWindow):
    # Emitted after the window has taken each worker event into account (tests wait on these).
    model_loaded = Signal(object)  # ModelLoaded
    run_paused = Signal(object)  # RunPaused
    error_shown = Signal(object)  # RunFailed

    def __init__(self, preferences: QSettings | None = None, *, persist: bool = True) -> None:
        super().__init__()
        self.preferences = preferences if preferences is not None else QSettings()
        self.persist = persist
        self.setWindowTitle("GradScope")
        self.setAcceptDrops(True)
        self.history = RunHistory()
        self.source: str | None = None
        self.weights: str | None = None
        self.loaded: ModelLoaded | None = None
        self.state = "empty"
        self.selected_layer: str | None = None
        self.selected_step: int | None = None  # None: follow the latest step
        self.error_dialog: ErrorDialog | None = None
        self._dirty = False
        self._origin_shown = False
        self._run_after_load = False
        self._loaded_settings: RunSettings | None = None
        self.settings_trail = SettingsTrail(None)
        # What was shown before a load started: restored if the load fails.
        self._before_load: tuple[str | None, str | None, str, str] | None = None
        self._cpu_defaults = False
        self._rate: deque[tuple[float, int]] = deque(maxlen=64)
        self._syncing_tree = False
        self._colors: dict[str, Any] = {}
        self._layer_order: list[str] = []
        self._layout_done = False
        self._fit_after_show = False  # see restore_geometry
        self._next_refresh = 0.0
        self._last_refresh = 0.0
        self._redraw_cost = 0.0
        self._paint_cpu_from: float | None = None
        self._state_restored = False

        # Before the run thread exists: garbage (Qt objects in cycles among it) is collected
        # on this thread only, never in the run thread (a freeze; see garbage_collection).
        self.garbage_collector = collect_on_gui_thread()
        self.run_thread = RunThread(self)
        # However the app ends, the run thread is joined before Qt tears down.
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.run_thread.shutdown)
        worker = self.run_thread.worker
        worker.model_loaded.connect(self._on_worker_model_loaded)
        worker.steps_finished.connect(self._on_worker_steps_finished)
        worker.run_paused.connect(self._on_worker_run_paused)
        worker.run_failed.connect(self._on_worker_run_failed)
        worker.watch_changed.connect(self._on_worker_watch_changed)

        self._build_central()
        self._build_docks()
        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        self._build_status_bar()
        self.debugger = self._build_debugger()
        self.recordings = self._build_recordings()
        # A message (a status tip, a note) gets the room of these, least needed first.
        self._yielding_labels = [self.recordings.label, self.debugger.memory_label, self.rate_label]
        self._yielded: list[QLabel] = []
        self.statusBar().messageChanged.connect(self._on_status_message_changed)
        self.comparison = RunComparison(
            self, runs_folder, lambda text: self.statusBar().showMessage(text, 8000)
        )
        self.comparison.runs_changed.connect(self._on_comparison_runs_changed)
        self.comparison.runs_grew.connect(self._on_comparison_runs_grew)
        self.debugger.branch_abandoned.connect(self.comparison.add_run)
        recent = self.recent_menu.menuAction()
        self.file_menu.insertAction(recent, self.comparison.add_action)
        self.file_menu.insertAction(recent, self.comparison.clear_action)
        self.file_menu.insertAction(recent, self.comparison.pin_action)
        # Application shortcuts work wherever the focus is (a text field's Ctrl+Z included).
        self.shortcut_router = shortcuts.install(self)
        self._update_actions()

        # Single-shot, re-armed at each tick for when it is next needed (see the tick).
        self.refresh_timer = QTimer(self)
        self.refresh_timer.setSingleShot(True)
        self.refresh_timer.timeout.connect(self._on_refresh_timer_timeout)
        self.refresh_timer.start(REFRESH_INTERVAL_MS)

    # -- construction --------------------------------------------------------------------
    def _build_central(self) -> None:
        self.plots = PlotPanel()
        self.plots.selection_made.connect(self._on_view_selection_made)
        self.setCentralWidget(self.plots)

    def _build_docks(self) -> None:
        self.tree_model = ModuleTreeModel(self)
        self.tree_model.watched_layers_edited.connect(self._on_tree_model_watched_layers_edited)
        self.tree_proxy = ModuleFilterModel(self)
        self.tree_proxy.setSourceModel(self.tree_model)
        self.tree_view = QTreeView()
        self.tree_view.setModel(self.tree_proxy)
        self.tree_view.setUniformRowHeights(True)
        self.tree_view.setAlternatingRowColors(True)
        self.tree_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.tree_view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.tree_view.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(NAME, QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(40)
        for column, width in ((TYPE, 84), (PARAMS, 56), (GRAD_NORM, 70), (STATUS, 80)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Interactive)
            header.resizeSection(column, width)
        self.tree_view.setIndentation(14)
        # A translucent selection, so the red of a selected NaN/Inf row still shows.
        palette = self.tree_view.palette()
        palette.setColor(QPalette.ColorRole.Highlight, QColor(40, 110, 220, 70))
        palette.setColor(QPalette.ColorRole.HighlightedText, QColor("black"))
        self.tree_view.setPalette(palette)
        self.tree_view.selectionModel().currentRowChanged.connect(
            self._on_tree_view_current_row_changed
        )
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter by name or type (e.g. conv, Linear, layer1)")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self._on_filter_edit_text_changed)
        layers = QWidget()
        layout = QVBoxLayout(layers)
        layout.setContentsMargins(4, 4, 4, 4)
        self.layer_actions = LayerTreeActions(
            self,
            self.tree_view,
            self.tree_model,
            self.tree_proxy,
            self.filter_edit,
            self._ask_statistics_csv,
        )
        filter_row = QHBoxLayout()
        filter_row.addWidget(self.filter_edit, 1)
        filter_row.addWidget(self.layer_actions.tick_matching_button)
        layout.addLayout(filter_row)
        # A filter kept from the last model can match nothing in this one: the tree was
        # empty with no word why.
        self.filter_hint = QLabel()
        self.filter_hint.setWordWrap(True)
        self.filter_hint.setStyleSheet("color: #8a4b00; padding: 2px;")
        self.filter_hint.setVisible(False)
        self.filter_hint.linkActivated.connect(lambda _link: self.filter_edit.clear())
        layout.addWidget(self.filter_hint)
        self.plots.layer_menu_requested.connect(self.layer_actions.popup_for)
        layout.addWidget(self.tree_view, 1)
        hint = QLabel(
            "Tick the layers to watch; red rows: NaN/Inf, orange: exploding, blue: vanishing, "
            "gold: an early warning."
        )
        hint.setWordWrap(True)
        hint.setStyleSheet("color: #666;")
        layout.addWidget(hint)

        self.settings_panel = SettingsPanel(cuda_devices())
        self.settings_panel.settings_edited.connect(self._on_settings_panel_settings_edited)
        self.settings_panel.pause_at_warning_toggled.connect(
            self._on_settings_panel_pause_at_warning_toggled
        )
        self.events_panel = EventsPanel()
        self.events_panel.selection_made.connect(self._on_view_selection_made)
        self.events_panel.warning_chosen.connect(self._on_events_panel_warning_chosen)

        # The left docks reach the bottom of the window: the step trace (bottom area) opens
        # under the plots only, not under Events (which it squeezed to 1.5 rows at 1280x800).
        self.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.layers_dock = self._dock("Layers", "layers", layers)
        self.settings_dock = self._dock("Run settings", "settings", self.settings_panel)
        self.events_dock = self._dock("Events", "events", self.events_panel)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.layers_dock)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.events_dock)
        self.tabifyDockWidget(self.layers_dock, self.settings_dock)
        self.setTabPosition(Qt.DockWidgetArea.LeftDockWidgetArea, QTabWidget.TabPosition.North)
        self.layers_dock.raise_()
        self.resizeDocks([self.layers_dock, self.events_dock], [560, 240], Qt.Orientation.Vertical)

    def _dock(self, title: str, name: str, widget: QWidget) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"{name}_dock")
        dock.setWidget(widget)
        dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QDockWidget.DockWidgetFeature.DockWidgetClosable
            | QDockWidget.DockWidgetFeature.DockWidgetFloatable
        )
        return dock

    def _action(
        self,
        text: str,
        slot: Any,
        shortcut: Any = None,
        icon: QStyle.StandardPixmap | None = None,
        tip: str = "",
    ) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if icon is not None:
            action.setIcon(self.style().standardIcon(icon))
        if tip:
            action.setStatusTip(tip)
            action.setToolTip(
                f"{tip} ({action.shortcut().toString()})" if shortcut is not None else tip
            )
        action.triggered.connect(slot)
        return action

    def _build_actions(self) -> None:
        sp = QStyle.StandardPixmap
        self.open_action = self._action(
            "&Open model script…",
            self._on_open_action_triggered,
            QKeySequence.StandardKey.Open,
            sp.SP_DialogOpenButton,
            "Open a .py model script",
        )
        self.open_torchvision_action = self._action(
            "Open model by &name…",
            self._on_open_torchvision_action_triggered,
            "Ctrl+Shift+O",
            sp.SP_ComputerIcon,
            "Open a torchvision model, a transformers model type (hf:) or a timm model (timm:)",
        )
        self.export_png_action = self._action(
            "Export plots as &PNG…", self._on_export_png_action_triggered, "Ctrl+E"
        )
        self.export_svg_action = self._action(
            "Export plots as S&VG…",
            self._on_export_svg_action_triggered,
            tip="The four plots as vector graphics (lines and text stay sharp at any size)",
        )
        self.export_statistics_action = self._action(
            "Export all statistics as CSV…",
            lambda: self._ask_statistics_csv(None),
            tip="step, layer, grad_norm, max_abs, weight_norm, update_ratio, status",
        )
        self.export_layer_action = self._action(
            "Export selected layer as CSV…",
            lambda: self._ask_statistics_csv(self.selected_layer),
            tip="Every statistic of the layer selected in the tree",
        )
        self.export_csv_action = self._action(
            "Export gradient norms as &CSV…", self._on_export_csv_action_triggered, "Ctrl+Shift+E"
        )
        self.quit_action = self._action("&Quit", self.close, QKeySequence.StandardKey.Quit)
        self.run_action = self._action(
            "&Run", self.run, "F5", sp.SP_MediaPlay, "Run or continue up to the steps setting"
        )
        self.pause_action = self._action(
            "&Pause", self.pause, "F6", sp.SP_MediaPause, "Pause after the current step"
        )
        self.step_action = self._action(
            "&Step", self.step, "F10", sp.SP_MediaSkipForward, "One forward/backward/optimizer step"
        )
        self.stop_action = self._action(
            "S&top",
            self.stop,
            "Shift+F5",
            sp.SP_MediaStop,
            "Stop the run (the next Run starts afresh)",
        )
        self.restart_action = self._action(
            "R&estart",
            self.restart,
            "Ctrl+Shift+F5",
            sp.SP_BrowserReload,
            "Reload the model and start a new run",
        )
        self.follow_action = self._action("&Follow latest step", self.follow_latest, "End")
        self.reset_zoom_action = self._action("&Reset plot zoom", self.plots.auto_range, "Ctrl+0")
        self.expand_action = self._action("&Expand module tree", self.tree_view.expandAll)
        self.collapse_action = self._action("&Collapse module tree", self._collapse_tree)
        self.about_action = self._action("&About GradScope", lambda: show_about(self))
        self.shortcuts_action = self._action(
            "&Keyboard shortcuts",
            self.show_shortcuts,
            "F1",
            tip="Every keyboard shortcut of the window",
        )
        self.app_help_url = app_section_url()
        self.app_help_action = self._action(
            "&Using the app (README)",
            self._on_app_help_action_triggered,
            tip="The README's section on the app: plots, comparing runs, recordings",
        )
        self.app_help_action.setEnabled(self.app_help_url is not None)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        self.file_menu = file_menu = bar.addMenu("&File")
        file_menu.addAction(self.open_action)
        file_menu.addAction(self.open_torchvision_action)
        self.samples_menu = file_menu.addMenu("Open &sample")
        self.samples_menu.aboutToShow.connect(self._fill_samples_menu)
        self._fill_samples_menu()
        self.recent_menu = file_menu.addMenu("Recent &models")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        self._fill_recent_menu()
        file_menu.addSeparator()
        file_menu.addAction(self.export_png_action)
        file_menu.addAction(self.export_svg_action)
        file_menu.addAction(self.export_csv_action)
        file_menu.addAction(self.export_statistics_action)
        file_menu.addAction(self.export_layer_action)
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)
        self.run_menu = run_menu = bar.addMenu("&Run")
        for action in (self.run_action, self.pause_action, self.step_action, self.stop_action):
            run_menu.addAction(action)
        run_menu.addSeparator()
        run_menu.addAction(self.restart_action)
        self.view_menu = view_menu = bar.addMenu("&View")
        for dock in (self.layers_dock, self.settings_dock, self.events_dock):
            view_menu.addAction(dock.toggleViewAction())
        view_menu.addSeparator()
        view_menu.addAction(self.follow_action)
        view_menu.addAction(self.reset_zoom_action)
        view_menu.addAction(self.expand_action)
        view_menu.addAction(self.collapse_action)
        help_menu = bar.addMenu("&Help")
        help_menu.addAction(self.shortcuts_action)
        help_menu.addAction(self.app_help_action)
        help_menu.addAction(self.about_action)

    def _build_toolbar(self) -> None:
        toolbar = QToolBar("Run")
        toolbar.setObjectName("run_toolbar")
        toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        toolbar.setMovable(False)
        toolbar.addAction(self.open_action)
        toolbar.addSeparator()
        for action in (
            self.run_action,
            self.pause_action,
            self.step_action,
            self.stop_action,
            self.restart_action,
        ):
            toolbar.addAction(action)
        toolbar.addSeparator()
        self.model_label = QLabel("")
        self.model_label.setStyleSheet("padding: 0 8px; font-weight: bold;")
        toolbar.addWidget(self.model_label)
        self.addToolBar(toolbar)
        self.toolbar = toolbar

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.state_label = QLabel()
        self.device_label = QLabel("device: -")
        self.step_label = QLabel("step: -")
        self.rate_label = QLabel("steps/s: -")
        self.loss_label = QLabel("loss: -")
        self.progress_label = QLabel("")
        self.precision_label = QLabel("")  # mixed precision: the scale, skipped steps
        self._precision = PrecisionSummary()
        for label in (
            self.state_label,
            self.progress_label,
            self.device_label,
            self.step_label,
            self.rate_label,
            self.loss_label,
            self.precision_label,
        ):
            label.setStyleSheet("padding: 0 8px;")
            bar.addPermanentWidget(label)
        self._set_state("empty")

    def _on_status_message_changed(self, text: str) -> None:
        """While a message shows, the least needed permanent fields (the recording's file,
        the rewind memory, steps/s) step aside as far as it needs: at 1280x800 they cut the
        Run button's tip to "Run or continue up to the st". They come back after it."""
        for label in self._yielded:
            label.show()
        self._yielded = []
        if not text:
            return
        bar = self.statusBar()
        needed = bar.fontMetrics().horizontalAdvance(text) + 24
        permanent = bar.findChildren(QLabel, options=Qt.FindChildOption.FindDirectChildrenOnly)
        shown = [w for w in permanent if w.isVisible()]
        # the message is drawn left of the first permanent field
        room = min(w.x() for w in shown) if shown else bar.width()
        spacing = max(0, bar.layout().spacing())
        for label in self._yielding_labels:
            if room >= needed:
                break
            if label.isVisible() and label.text():
                room += label.width() + spacing
                label.hide()
                self._yielded.append(label)

    def _build_debugger(self) -> StepDebugger:
        debugger = StepDebugger(
            DebuggerParts(
                run_thread=self.run_thread,
                status_bar=self.statusBar(),
                history=lambda: self.history,
                state=lambda: self.state,
                loaded=lambda: self.loaded,
                model_loaded=self.model_loaded,
                run_paused=self.run_paused,
                make_action=self._action,
                make_dock=self._dock,
                dialog_parent=self,
            ),
            self,
        )
        debugger.install_docks(self, self.events_dock)
        debugger.install_menus(self.run_menu, self.view_menu, self.toolbar)
        debugger.state_changed.connect(self._set_state)
        debugger.selection_made.connect(self._on_view_selection_made)
        debugger.flow_changed.connect(self._on_debugger_flow_changed)
        # Before the recordings controller's: the window forgets the branch, then the
        # recording does.
        debugger.rewound.connect(self._on_debugger_rewound)
        return debugger

    def _build_recordings(self) -> RecordingController:
        recordings = RecordingController(
            RecordingParts(
                preferences=self.preferences,
                persist=self.persist,
                status_bar=self.statusBar(),
                toolbar=self.toolbar,
                loss_plot=self.plots.loss.item,
                events_panel=self.events_panel,
                history=lambda: self.history,
                state=lambda: self.state,
                model_loaded=self.model_loaded,
                steps_finished=self.run_thread.worker.steps_finished,
                rewound=self.debugger.rewound,
                make_action=self._action,
                dialog_parent=self,
            ),
            self,
        )
        recordings.install_menus(self.file_menu, self.view_menu, self.recent_menu.menuAction())
        recordings.recording_loaded.connect(self._on_recordings_recording_loaded)
        recordings.steps_followed.connect(self._on_recordings_steps_followed)
        recordings.error_dialog_opened.connect(self._on_recordings_error_dialog_opened)
        return recordings

    # -- public commands -----------------------------------------------------------------
    def open_model(
        self,
        source: str,
        overrides: dict[str, Any] | None = None,
        weights: str | None = None,
        *,
        run_after_load: bool = False,
    ) -> None:
        """Load ``source`` (a .py path or torchvision name) in the run thread. The model
        loaded now stays until the new one has loaded (a failed open keeps it)."""
        if self._before_load is None:
            self._before_load = (self.source, self.weights, self.state, self.model_label.text())
        self.source = source
        self.weights = weights
        # The script's values and CONFIG win: what the user changed last time is offered in
        # the settings panel, never applied silently (samples must reproduce their failure).
        merged = dict(overrides or {})
        self._run_after_load = run_after_load
        defaults = dict(APP_DEFAULTS)
        self._cpu_defaults = not source.endswith(".py") and not cuda_devices()
        if self._cpu_defaults:
            defaults.update(CPU_TORCHVISION_DEFAULTS)
        self._set_state("loading")
        self.model_label.setText(Path(source).name if source.endswith(".py") else source)
        self.run_thread.load(LoadRequest(source, merged, weights, defaults=defaults))

    def run(self) -> None:
        if self.state in ("empty", "loading", "running", "recording") or self.source is None:
            return
        if self.state in ("stopped", "failed"):
            self.restart(run_after_load=True)
            return
        settings = self.settings_panel.settings()
        remaining = settings.steps - self.history.count
        if remaining <= 0:
            remaining = max(settings.steps, 1)
        self.selected_step = None
        if self.run_thread.run(remaining):
            self._set_state("running")

    def step(self) -> None:
        if (
            self.state in ("empty", "loading", "running", "stopped", "failed", "recording")
            or self.loaded is None
        ):
            return
        if self.run_thread.run(1):
            self.selected_step = None
            self._set_state("running")

    def pause(self) -> None:
        if self.state == "running":
            self.run_thread.pause()
            self._show_ending("pausing")

    def stop(self) -> None:
        if self.state == "running":
            self.run_thread.stop()
            self._show_ending("stopping")
        elif self.state in ("ready", "paused", "halted", "done", "step_failed"):
            self._set_state("stopped")

    def restart(self, run_after_load: bool = False) -> None:
        if self.source is None or self.state == "loading":
            return
        settings = self.settings_panel.settings()
        overrides = settings.to_dict()
        overrides["layers"] = self.tree_model.watched_layers() if self.tree_model.tree else None
        self.open_model(self.source, overrides, self.weights, run_after_load=run_after_load)

    def _on_app_help_action_triggered(self) -> None:
        if self.app_help_url is not None:
            QDesktopServices.openUrl(self.app_help_url)

    def show_shortcuts(self) -> shortcuts.ShortcutsDialog:
        dialog = shortcuts.ShortcutsDialog(self)
        dialog.open()
        return dialog

    def follow_latest(self) -> None:
        self.selected_step = None
        self._dirty = True

    def select(self, layer: str | None = None, step: int | None = None) -> None:
        """Show ``layer`` and/or ``step`` in every view (None keeps the current one)."""
        if layer is not None:
            self.selected_layer = layer
            self._select_tree_row(layer)
        if step is not None:
            self.selected_step = step
        self.plots.show_selection(self.selected_layer, self._shown_step())
        self._dirty = True

    # -- exports -------------------------------------------------------------------------
    def export_png(self, path: str) -> bool:
        return self.plots.grab().save(path)

    def export_svg(self, path: str) -> bool:
        """The plots as Qt paints them, into an SVG file (pyqtgraph's own SVG exporter fails
        under this Qt: see gradscope.gui.plots.plot_widget)."""
        from PySide6.QtSvg import QSvgGenerator

        generator = QSvgGenerator()
        generator.setFileName(path)
        generator.setSize(self.plots.size())
        generator.setViewBox(QRect(QPoint(0, 0), self.plots.size()))
        generator.setTitle("GradScope plots")
        painter = QPainter()
        if not painter.begin(generator):
            return False
        try:
            self.plots.render(painter, QPoint(0, 0))
        finally:
            painter.end()
        return Path(path).is_file() and Path(path).stat().st_size > 0

    def export_csv(self, path: str) -> None:
        """Gradient norm per layer and step as the engine measured it (empty: not watched)."""
        history = self.history
        names = [n for n in self._layer_order if history.has_layer(n)] or history.layer_names
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["step", "loss", *[n or "(model)" for n in names]])
            columns = [history.column(n) for n in names]
            matrix = history.matrix("grad_norm")[:, columns]
            for row in range(history.count):
                values = ["" if v == MISSING else repr(float(v)) for v in matrix[row]]
                writer.writerow(
                    [int(history.steps[row]), repr(float(history.losses[row])), *values]
                )

    def export_statistics_csv(self, path: str, layer: str | None = None) -> int:
        """Every statistic of every layer (or of ``layer``), one row per step and layer, as
        ``gradscope report --csv`` writes it. Returns the number of rows."""
        from gradscope.core.recording import write_csv

        return write_csv(self.history, path, None if layer is None else [layer])

    def _ask_statistics_csv(self, layer: str | None) -> None:
        if layer is not None and not self.history.has_layer(layer):
            self.statusBar().showMessage("Select a watched layer in the tree first", 8000)
            return
        name = "statistics.csv" if layer is None else f"{layer or 'model'}.csv"
        path, _ = QFileDialog.getSaveFileName(
            self, "Export statistics as CSV", name, "CSV files (*.csv)"
        )
        if path:
            rows = self.export_statistics_csv(path, layer)
            self.statusBar().showMessage(f"wrote {rows} rows to {path}", 8000)

    def save_screenshot(self, path: str) -> bool:
        self._refresh()
        # Plots settle their auto-range on the first paint; grab after it.
        for _ in range(3):
            QApplication.processEvents()
            self.grab()
        return self.grab().save(path)

    def _fit_to_screen(self) -> None:
        fit_to_screen(self)

    def fit_to_screen_when_shown(self) -> None:
        """Fit the window, title bar included, into its screen once it is shown (the frame
        is known only then): a default size of the screen's whole available area put the
        status bar of a 1280x800 screen below its edge."""
        self._fit_after_show = True

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._fit_after_show:
            self._fit_after_show = False
            fit_to_screen(self)
            # With the window as the timer's context: a window closed before (a test, a
            # quick quit) cancels it.
            QTimer.singleShot(300, self, self._fit_to_screen)
        if not self._layout_done:
            self._layout_done = True
            if not self._state_restored:
                width = max(400, min(560, int(self.width() * 0.37)))
                self.resizeDocks([self.layers_dock], [width], Qt.Orientation.Horizontal)
                self.resizeDocks(
                    [self.layers_dock, self.events_dock],
                    [int(self.height() * 0.5), int(self.height() * 0.4)],
                    Qt.Orientation.Vertical,
                )

    # -- worker events -------------------------------------------------------------------
    def _show_tree(self, tree: Any, watched: list[str]) -> None:
        self.plots.clear()
        self.events_panel.clear()
        self.tree_model.set_tree(tree, watched)
        self._show_filter_hint()
        watched_set = set(watched)
        self._layer_order = [
            node.name for node in tree if node.own_params > 0 or node.name in watched_set
        ]
        self._colors = {name: layer_color(i) for i, name in enumerate(self._layer_order)}
        self.tree_view.expandToDepth(1 if len(tree) > 40 else 3)
        self.selected_layer = None

    def show_recorded_run(
        self, tree: Any, history: RunHistory, display_name: str, settings: RunSettings
    ) -> None:
        """Show a recording: its module tree and history, without a model (nothing to run).
        The recording's own code (gui/recordings.py) keeps it up to date when following."""
        if self.state == "running":
            self.run_thread.stop()
        self.source = None
        self.loaded = None
        self.history = history
        self._rate.clear()
        self._origin_shown = False
        self.selected_step = None
        self._show_tree(tree, list(history.layer_names))
        self.debugger.show_recording(history.first_nonfinite)
        self.settings_panel.set_settings(settings, running=settings)
        self.settings_panel.set_read_only(True)
        self.settings_panel.set_image_size_applies(False)
        self.debugger.follow_trace_setting(False)
        self.settings_panel.set_notes([])
        self.setWindowTitle(f"GradScope — {display_name}")
        self.model_label.setText(display_name)
        self.device_label.setText("device: -")
        self._set_state("recording")
        self._dirty = True
        self._refresh()

    @Slot(object)
    def _on_worker_model_loaded(self, payload: ModelLoaded) -> None:
        self.run_thread.mark_idle()
        self._before_load = None
        self.loaded = payload
        self.history = RunHistory()
        # A live run's named statistics show under their labels, as a recording's do.
        self.history.describe_statistics(payload.statistic_infos)
        self._rate.clear()
        self._origin_shown = False
        self.selected_step = None
        self._show_tree(payload.tree, [layer.name for layer in payload.layers])
        self._loaded_settings = payload.settings
        self.settings_trail = SettingsTrail(payload.settings)
        self.settings_panel.set_read_only(False)
        self.settings_panel.set_settings(payload.settings, running=payload.settings)
        source = payload.source
        self.settings_panel.set_image_size_applies(
            not source.endswith(".py") and not source.startswith("hf:")
        )
        self.debugger.follow_trace_setting(bool(getattr(payload.settings, "trace", False)))
        self.settings_panel.set_layers(payload.settings.layers)
        last = self._persisted_overrides(payload.source) if self.persist else {}
        self.settings_panel.set_script_defaults(payload.script_settings, last)
        notes = list(payload.notes)
        if self._cpu_defaults and payload.source.startswith("hf:"):
            # Token batches: the image size means nothing to a transformers model.
            notes.insert(
                0,
                "No GPU here: the model starts with a CPU-friendly batch "
                f"({CPU_TORCHVISION_DEFAULTS['batch_size']}); raise it and "
                "Restart.",
            )
        elif self._cpu_defaults:
            kind = "timm" if payload.source.startswith("timm:") else "torchvision"
            notes.insert(
                0,
                f"No GPU here: {kind} models start with a CPU-friendly image "
                f"size ({CPU_TORCHVISION_DEFAULTS['image_size']}, or what the model "
                f"needs) and batch ({CPU_TORCHVISION_DEFAULTS['batch_size']}); "
                "raise them and Restart for the usual 224.",
            )
        self.settings_panel.set_notes(notes, payload.architecture)
        self.setWindowTitle(f"GradScope — {payload.display_name}")
        self.model_label.setText(payload.display_name)
        self.device_label.setText(f"device: {payload.device}")
        self.comparison.model_shown(f"model:{payload.source}")
        if self.persist:
            self._remember_model(payload.source)
        self._set_state("ready")
        self._dirty = True
        self._refresh()
        # What the load created (the model, torch's lazily imported modules) is long-lived:
        # collect and set it aside now, not in a stall in the middle of the run.
        self.garbage_collector.settle()
        self.model_loaded.emit(payload)
        if self._run_after_load:
            self._run_after_load = False
            self.run()

    @Slot(object)
    def _on_worker_steps_finished(self, payload: StepsFinished) -> None:
        if self.loaded is None:
            return
        # In runs of steps with one layer layout (it changes when the watched layers do).
        for _, run in groupby(
            payload.records, key=lambda record: (record.layer_names, record.param_names)
        ):
            records = list(run)
            first = records[0]
            self.history.extend(
                [(r.result.step, r.result.loss, r.result.stats, r.result.origin) for r in records],
                first.layer_names,
                first.layer_types,
                first.layer_params,
                param_names=first.param_names or None,
                param_layers=first.param_layers,
            )
            for record in records:  # a what-if while paused shows in Events
                change = self.settings_trail.note(int(record.result.step), record.settings)
                if change is not None:
                    self.history.events.append(
                        Event(int(record.result.step), "settings", None, change)
                    )
        self._rate.append((time.perf_counter(), self.history.count))
        self._dirty = True

    @Slot(object)
    def _on_worker_run_paused(self, payload: RunPaused) -> None:
        self.run_thread.mark_idle()
        if self.loaded is None:
            if self.state == "running":  # a live run's end, after a recording was opened
                self._set_state("recording" if self.recordings.reader else "empty")
            return
        if self.state == "loading":
            # A run stopped because another model is being opened: that load decides.
            self.run_thread.busy = True
            self.run_paused.emit(payload)
            return
        state = {
            "nonfinite": "halted",
            "stopped": "stopped",
            "failed": "step_failed",
            "completed": "done",
        }.get(payload.reason, "paused")
        if state == "done" and self.history.count < self.settings_panel.settings().steps:
            state = "paused"  # a Step, or Apply, is not the end of the run
        if self.state == "failed":
            state = "failed"
        self._set_state(state)
        self._rate.clear()
        self._dirty = True
        self._refresh()
        if payload.reason == "nonfinite":
            self._show_origin(force=True)
        if payload.reason == "warning" and self.history.warnings:
            step = self.history.warnings[-1].step  # the step the run paused after
            first = next(w for w in self.history.warnings if w.step == step)
            where = first.module if first.module is not None else "the model"
            self.statusBar().showMessage(
                f"Paused at the first early warning, step {first.step}: {first.kind} in "
                f"{where or '(model root)'}; Run goes on",
                15000,
            )
        self.run_paused.emit(payload)

    @Slot(object)
    def _on_worker_run_failed(self, payload: RunFailed) -> None:
        if payload.stage == "load":
            self.run_thread.mark_idle()
            self._run_after_load = False
            before, self._before_load = self._before_load, None
            if before is not None and (self.loaded is not None or before[2] == "recording"):
                # The model (or recording) shown before stays, with its name and its run:
                # the toolbar named the script that failed over a recording's plots.
                self.source, self.weights, state, label = before
                self.model_label.setText(label)
                self._set_state("paused" if state in ("running", "loading") else state)
            else:
                self.loaded = None
                self._set_state("failed")
        title = {
            "load": "The model could not be loaded",
            "step": "The step failed",
            "settings": "The settings could not be applied",
        }.get(payload.stage, "Error")
        if self.error_dialog is not None:
            self.error_dialog.close()
        self.error_dialog = ErrorDialog(self, title, payload.message, payload.details)
        self.error_dialog.open()
        self.statusBar().showMessage(payload.message, 15000)
        self.error_shown.emit(payload)

    @Slot(object)
    def _on_worker_watch_changed(self, payload: WatchChanged) -> None:
        self.tree_model.set_watched([layer.name for layer in payload.layers])
        self.history.describe_statistics(payload.statistic_infos)
        self._dirty = True

    # -- controller events ---------------------------------------------------------------
    @Slot()
    def _on_debugger_flow_changed(self) -> None:
        self._dirty = True

    @Slot(int)
    def _on_debugger_rewound(self, step: int) -> None:
        """The debugger rewound the history to before ``step``: what the window showed of
        the abandoned branch goes (its settings changes, hover, selection, origin)."""
        self.settings_trail.rewind(step)
        self.events_panel.clear()
        self.plots.hide_hover()
        if self.history.first_nonfinite is None:
            self.tree_model.set_origin(None)
            self._origin_shown = False
        self.selected_step = None
        self._dirty = True

    @Slot(object)
    def _on_recordings_recording_loaded(self, run: RecordedRun) -> None:
        reader = self.recordings.reader
        # The ranks of one distributed run are one model: switching rank keeps the runs.
        path = str(reader.path.resolve()) if reader is not None else run.name
        self.comparison.model_shown("recording:" + re.sub(r"\.rank\d+(?=\.gsrec$)", "", path))
        self.show_recorded_run(run.tree, run.history, run.name, run.settings)

    @Slot(int)
    def _on_recordings_steps_followed(self, added: int) -> None:
        if added:
            self._dirty = True
            # The failing step's trace, when it first arrives in a followed recording.
            self.debugger.show_recorded_trace(self.history.first_nonfinite)

    @Slot(object)
    def _on_recordings_error_dialog_opened(self, dialog: ErrorDialog) -> None:
        self.error_dialog = dialog

    # -- view events ---------------------------------------------------------------------
    @Slot(object)
    def _on_view_selection_made(self, selection: Selection) -> None:
        self.select(selection.layer, selection.step)

    def _on_tree_view_current_row_changed(self, current: Any, _previous: Any) -> None:
        if self._syncing_tree or not current.isValid():
            return
        name = current.data(NAME_ROLE)
        if name is not None:
            self.selected_layer = name
            self.plots.show_selection(name, self._shown_step())

    def _on_tree_model_watched_layers_edited(self, names: list[str]) -> None:
        self.settings_panel.set_layers(names)
        self.run_thread.queue_settings(self.settings_panel.settings())
        self._dirty = True

    def _on_events_panel_warning_chosen(self, warning: EarlyWarning) -> None:
        # Its quantity's plot, where the limit and the projection are drawn (the loss and
        # the gradient norm have no per-layer plot: the loss plot shows the loss already).
        statistic = QUANTITY_STATISTICS.get(warning.quantity)
        if statistic in STATISTIC_LABELS or statistic in self.history.figure_names:
            self.plots.show_statistic(statistic, self.history)

    def _on_settings_panel_pause_at_warning_toggled(self, checked: bool) -> None:
        self.run_thread.worker.pause_at_warning = checked

    def _on_settings_panel_settings_edited(self, settings: RunSettings) -> None:
        self.debugger.follow_trace_setting(bool(getattr(settings, "trace", False)))
        if self.loaded is not None:
            self.run_thread.queue_settings(settings)
        if self.persist and self.source and self._loaded_settings is not None:
            self._persist_overrides(self.source, settings)
        self._dirty = True

    def _on_filter_edit_text_changed(self, text: str) -> None:
        self.tree_proxy.set_filter_text(text)
        self._show_filter_hint()

    def _show_filter_hint(self) -> None:
        text = self.filter_edit.text().strip()
        empty = bool(text) and self.tree_model.rowCount() > 0 and self.tree_proxy.rowCount() == 0
        if empty:
            self.filter_hint.setText(
                f"No layer of this model matches the filter “{html.escape(text)}”: "
                "<a href='clear'>clear the filter</a>."
            )
        self.filter_hint.setVisible(empty)
        if text:
            self.tree_view.expandAll()

    def _on_refresh_timer_timeout(self) -> None:
        try:
            if self.state == "running":
                self._show_step_progress()
            self._redraw_if_due()
        finally:
            self._arm_refresh_timer()

    def _arm_refresh_timer(self) -> None:
        # The next tick: one interval on while a paint is to be accounted for or nothing is
        # to be drawn (new steps may come any moment); otherwise when the next redraw is
        # due. During a fast run that is about once a second, not 30 times: each time this
        # thread wakes it takes the GIL from the run thread, and on a 2-core machine a few
        # hundred microseconds of its steps with it.
        delay = REFRESH_INTERVAL_MS
        if self._dirty and self._paint_cpu_from is None:
            delay = max(delay, round((self._next_refresh - time.perf_counter()) * 1000))
        self.refresh_timer.start(delay)

    def _redraw_if_due(self) -> None:
        # The paint of the last redraw has happened by now (it comes before this tick):
        # the run thread may step again.
        self.run_thread.worker.gui_idle.set()
        if self._paint_cpu_from is not None:
            self._redraw_cost += time.thread_time() - self._paint_cpu_from
            self._paint_cpu_from = None
            self._schedule_next_refresh()
        if self._dirty and time.perf_counter() >= self._next_refresh:
            started, cpu_started = time.perf_counter(), time.thread_time()
            if self.state == "running":
                # The run thread waits before its next step until the next tick, after the
                # paint: the redraw gets the GIL and a core to itself.
                self.run_thread.worker.gui_idle.clear()
            self._refresh()
            self._last_refresh = started
            self._redraw_cost = time.thread_time() - cpu_started
            self._paint_cpu_from = time.thread_time()
            self._schedule_next_refresh()

    def _schedule_next_refresh(self) -> None:
        # A redraw costs its refresh and the paint that follows it (measured as this
        # thread's CPU time until the next tick). Costly redraws come less often, so that
        # the event loop (menus, zoom, the tree) always has most of the time, and, while a
        # run goes on, the run thread too: both need the GIL, and each millisecond the GUI
        # thread holds it is one the training loop waits.
        share = RUNNING_REDRAW_SHARE if self.state == "running" else IDLE_REDRAW_SHARE
        self._next_refresh = self._last_refresh + max(
            REFRESH_INTERVAL_MS / 1000, self._redraw_cost / share
        )

    def _on_open_action_triggered(self) -> None:
        start = (
            str(Path(self.source).parent)
            if self.source and self.source.endswith(".py")
            else str(SAMPLE_DIR)
        )
        path, _ = QFileDialog.getOpenFileName(
            self, "Open model script", start, "Model scripts (*.py)"
        )
        if path:
            self.open_model(path)

    def _on_open_torchvision_action_triggered(self) -> None:
        from gradscope.core.loading import torchvision_model_names

        dialog = ModelDialog(self, torchvision_model_names())
        if dialog.exec() and dialog.selected_name():
            self.open_model(dialog.selected_name() or "")

    def _on_export_png_action_triggered(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export plots as PNG", "gradscope.png", "PNG images (*.png)"
        )
        if path:
            self.export_png(path)

    def _on_export_svg_action_triggered(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export plots as SVG", "gradscope.svg", "SVG images (*.svg)"
        )
        if path and not self.export_svg(path):
            self.statusBar().showMessage(f"Could not write {path}", 8000)

    def _on_export_csv_action_triggered(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export gradient norms as CSV", "gradient_norms.csv", "CSV files (*.csv)"
        )
        if path:
            self.export_csv(path)

    # -- drawing -------------------------------------------------------------------------
    def _shown_step(self) -> int | None:
        if self.selected_step is not None:
            return self.selected_step
        return int(self.history.steps[-1]) if self.history.count else None

    def _refresh(self) -> None:
        self._dirty = False
        history = self.history
        settings = self.settings_panel.settings()
        step = self._shown_step()
        view = PlotView(
            history=history,
            order=self._layer_order,
            visible=set(self.tree_model.watched_layers()),
            selected_layer=self.selected_layer,
            selected_step=step,
            explode_threshold=settings.explode_threshold,
            vanish_threshold=settings.vanish_threshold,
            colors=self._colors,
            flow=self.debugger.flow_override,
            flow_title=self.debugger.flow_title,
            live=self.state == "running",
            run_name=self.model_label.text(),
            compared=self.comparison.runs,
            empty_hint=self._empty_hint(),
        )
        self.plots.refresh(view)
        self._refresh_tree_values(step)
        self.events_panel.update_events(history.events, history.first_nonfinite, history.warnings)
        self.events_panel.set_compared_origins(
            [
                (run.name, run.history.first_nonfinite)
                for run in self.comparison.runs
                if run.history.first_nonfinite is not None
            ]
        )
        self._show_origin()
        self._refresh_status_bar()

    def _empty_hint(self) -> str:
        """What the empty plots tell the user to do."""
        if self.state == "recording":
            return "No steps recorded yet: following the recording as its writer adds them."
        if self.loaded is not None and self.state not in ("loading", "failed"):
            return "No steps yet: press Run (F5) to train, or Step (F10) for one step."
        if self.state == "loading":
            return "Loading the model…"
        return "Open a model script (Ctrl+O), a model by name or a recording (File menu)."

    def _on_comparison_runs_grew(self) -> None:
        self._dirty = True

    def _on_comparison_runs_changed(self) -> None:
        self.plots.follow_range = True  # the step axis takes in every run compared
        self._refresh()

    def _refresh_tree_values(self, step: int | None) -> None:
        history = self.history
        row = history.row_of_step(step) if step is not None else None
        norms: dict[str, float] = {}
        statuses: dict[str, int] = {}
        if row is not None and history.layer_names:
            values = history.matrix("grad_norm")[row]
            status = history.status_matrix()[row]
            for name, value, flag in zip(
                history.layer_names, values.tolist(), status.tolist(), strict=True
            ):
                if flag != STATUS_MISSING:
                    norms[name] = value
                    statuses[name] = flag
        warnings = history.warnings
        if step is not None:
            warnings = [warning for warning in warnings if warning.step <= step]
        self.tree_model.set_step_values(norms, statuses, history.tiny_reasons, warnings)

    def _show_origin(self, force: bool = False) -> None:
        origin = self.history.first_nonfinite
        if origin is None or (self._origin_shown and not force):
            return
        module = origin.module
        if self.tree_model.origin != module:
            self.tree_model.set_origin(module, origin.describe(), origin.kind)
        if not self._origin_shown or force:
            self._origin_shown = True
            self.selected_step = origin.step
            if module is not None:
                self.selected_layer = module
                self._select_tree_row(module)
            self.plots.show_selection(self.selected_layer, origin.step)
            # Also when it arrived without a pause (a followed recording): Diagnosis too.
            self.debugger.show_origin(origin)
            self._dirty = True

    def _select_tree_row(self, name: str) -> None:
        source = self.tree_model.index_of(name)
        if not source.isValid():
            return
        index = self.tree_proxy.mapFromSource(source)
        if not index.isValid():
            return
        parent = index.parent()
        while parent.isValid():
            self.tree_view.expand(parent)
            parent = parent.parent()
        self._syncing_tree = True
        try:
            self.tree_view.setCurrentIndex(index)
        finally:
            self._syncing_tree = False
        self.tree_view.scrollTo(index, QAbstractItemView.ScrollHint.PositionAtCenter)

    def _collapse_tree(self) -> None:
        self.tree_view.collapseAll()
        self.tree_view.expandToDepth(0)

    def _refresh_status_bar(self) -> None:
        history = self.history
        if history.count:
            self.step_label.setText(f"step: {int(history.steps[-1])}  ({history.count} done)")
            self.loss_label.setText(f"loss: {format_value(float(history.losses[-1]))}")
        else:
            self.step_label.setText("step: -")
            self.loss_label.setText("loss: -")
        rate = self._steps_per_second()
        self.rate_label.setText(f"steps/s: {rate:.1f}" if rate is not None else "steps/s: -")
        text, tip = self._precision.text(history)
        self.precision_label.setText(text)
        self.precision_label.setToolTip(tip)
        self.precision_label.setVisible(bool(text))

    def _steps_per_second(self) -> float | None:
        if self.state != "running" or len(self._rate) < 2:
            return None
        now = time.perf_counter()
        recent = [(t, c) for t, c in self._rate if now - t <= 3.0] or list(self._rate)[-2:]
        if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
            return None
        return (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])

    def _show_ending(self, how: str) -> None:
        """At once, while the run ends after its current step (seconds on a big model):
        "Pausing after this step…", and Pause and Stop cannot be pressed again."""
        text, color = _STATE_TEXT[how]
        self.state_label.setText(f"<b style='color:{color}'>{text}</b>")
        self.pause_action.setEnabled(False)
        if how == "stopping":
            self.stop_action.setEnabled(False)
        self._show_step_progress()

    def _show_step_progress(self) -> None:
        """Where a long step stands (forward/backward, by module), read from the worker."""
        snapshot = self.run_thread.worker.progress.snapshot() if self.state == "running" else None
        text = snapshot.describe() if snapshot is not None and snapshot.seconds >= 1 else ""
        if self.progress_label.text() != text:
            self.progress_label.setText(text)

    def _set_state(self, state: str) -> None:
        was_running = self.state == "running"
        self.state = state
        if was_running != (state == "running"):
            # The redraw share changed: so does when the next redraw is due (a paused run's
            # plots must not wait for a delay armed while it ran).
            self._schedule_next_refresh()
            if self._dirty and self._paint_cpu_from is None:
                self._arm_refresh_timer()
        self._show_step_progress()
        # While a model loads, its settings are not known yet: nothing to edit.
        self.settings_panel.setEnabled(state != "loading")
        text, color = _STATE_TEXT[state]
        if state == "halted":
            color = STATUS_COLORS[3]
        self.state_label.setText(f"<b style='color:{color}'>{text}</b>")
        self._update_actions()

    def _update_actions(self) -> None:
        state = self.state
        has_model = self.source is not None
        self.run_action.setEnabled(
            has_model
            and state
            in (
                "ready",
                "paused",
                "halted",
                "done",
                "stopped",
                "failed",
                "before_apply",
                "step_failed",
            )
        )
        # Nothing to continue before a first step that worked (the first one failed).
        resumable = state in ("paused", "halted", "before_apply", "step_failed")
        self.run_action.setText("&Continue" if resumable and self.history.count else "&Run")
        self.pause_action.setEnabled(state == "running")
        self.step_action.setEnabled(
            has_model
            and state in ("ready", "paused", "halted", "done", "before_apply", "step_failed")
        )
        # A finished run has nothing to stop.
        self.stop_action.setEnabled(
            has_model and state in ("running", "paused", "halted", "before_apply", "step_failed")
        )
        self.restart_action.setEnabled(has_model and state != "loading")
        self.export_png_action.setEnabled(self.history.count > 0 or state != "empty")
        self.export_csv_action.setEnabled(True)
        debugger = getattr(self, "debugger", None)
        if debugger is not None:
            debugger.update_actions()

    # -- persistence ---------------------------------------------------------------------
    def _fill_samples_menu(self) -> None:
        self.samples_menu.clear()
        samples = sorted(SAMPLE_DIR.glob("*.py")) if SAMPLE_DIR.is_dir() else []
        for path in samples:
            if path.name.startswith("_"):
                continue
            action = self.samples_menu.addAction(path.stem.replace("_", " "))
            action.setToolTip(str(path))
            action.triggered.connect(lambda _=False, p=str(path): self.open_model(p))
        self.samples_menu.setEnabled(bool(samples))

    def recent_models(self) -> list[str]:
        value = self.preferences.value("model/recent", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_models()
        for source in recent:
            action = self.recent_menu.addAction(source)
            action.triggered.connect(lambda _=False, s=source: self.open_model(s))
        if recent:
            self.recent_menu.addSeparator()
            self.recent_menu.addAction("Clear recent", self._clear_recent)
        self.recent_menu.setEnabled(bool(recent))

    def _clear_recent(self) -> None:
        self.preferences.setValue("model/recent", [])

    def _remember_model(self, source: str) -> None:
        recent = [s for s in self.recent_models() if s != source]
        self.preferences.setValue("model/recent", [source, *recent][:RECENT_LIMIT])
        self.preferences.setValue("model/last", source)

    def _overrides_key(self, source: str) -> str:
        return "run_settings/" + source.replace("/", "|").replace("\\", "|")

    def _persisted_overrides(self, source: str) -> dict[str, Any]:
        text = self.preferences.value(self._overrides_key(source), "")
        try:
            data = json.loads(text) if text else {}
        except (TypeError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        data = {k: v for k, v in data.items() if k in SETTING_NAMES and k != "layers"}
        device = str(data.get("device", ""))
        if device.startswith("cuda") and device.split(":")[0] and not cuda_devices():
            data.pop("device")
        return data

    def _persist_overrides(self, source: str, settings: RunSettings) -> None:
        """Remember the settings the user changed for this model (against its script's
        values), to offer them the next time it is opened."""
        loaded = self.loaded
        base = loaded.script_settings if loaded is not None else None
        if base is None:
            return
        stored = {
            name: getattr(settings, name)
            for name in SETTING_NAMES
            if name != "layers" and getattr(settings, name) != getattr(base, name)
        }
        self.preferences.setValue(self._overrides_key(source), json.dumps(stored))

    def restore_geometry(self) -> bool:
        geometry = self.preferences.value("window/geometry")
        state = self.preferences.value("window/state")
        restored = isinstance(geometry, QByteArray) and self.restoreGeometry(geometry)
        if isinstance(state, QByteArray):
            self._state_restored = self.restoreState(state)
        if restored:
            fit_to_screen(self)
            # The window frame's size is known only once the window is shown (on X11 a
            # little later still): fitted again then.
            self._fit_after_show = True
        return bool(restored)

    # -- Qt events -----------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        if self.persist:
            self.preferences.setValue("window/geometry", self.saveGeometry())
            self.preferences.setValue("window/state", self.saveState())
            self.preferences.sync()
        self.refresh_timer.stop()
        app = QApplication.instance()
        if app is not None:
            app.removeEventFilter(self.shortcut_router)
        # The window goes at once; a long step going on is abandoned at its next module
        # boundary (shutdown), not waited for.
        self.hide()
        self.run_thread.shutdown()
        # after the run thread: no step can arrive for the recording any more
        self.recordings.close()
        super().closeEvent(event)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(url.toLocalFile().endswith((".py", ".gsrec")) for url in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        for url in event.mimeData().urls():
            path = url.toLocalFile()
            if path.endswith(".py"):
                self.open_model(path)
                event.acceptProposedAction()
                return
            if path.endswith(".gsrec"):
                self.recordings.open_recording(path)
                event.acceptProposedAction()
                return

    def recent_menu_actions(self) -> list[QAction]:
        return [a for a in self.recent_menu.actions() if not a.isSeparator()]

    def sample_menu(self) -> QMenu:
        return self.samples_menu
