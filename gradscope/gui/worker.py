"""The background run: a QObject moved to a QThread drives the engine's StepRunner.

The GUI thread never touches the model. It asks the worker to load a model or to run some
steps (queued signals), and sets stop/pause flags and pending settings directly; the worker
checks them between steps. Results come back as plain data (numpy arrays and dataclasses
from the engine), batched so that a model doing a thousand steps a second sends the GUI a
few dozen signals a second, not a thousand.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from gradscope.core.history import owner_layers
from gradscope.core.step_progress import StepAborted, StepProgress

# Seconds between two batches of step results sent to the GUI while steps are fast. While a
# fast run goes on the plots redraw about once a second (see MainWindow's refresh timer), and
# each batch wakes the GUI thread, which then takes the GIL from this one.
_EMIT_INTERVAL = 0.1
# How long a step waits at most for the GUI thread to finish a redraw (see ``gui_idle``).
_GUI_WAIT_LIMIT = 0.2

# Settings fixed for a run: changing them needs a restart (a new model).
# The built run's: the engine refuses to change mixed precision mid-run.
RESTART_SETTINGS = ("device", "seed", "image_size", "amp", "amp_init_scale")


# -- payloads (one dataclass per signal) ------------------------------------------------
@dataclass(frozen=True)
class LoadRequest:
    source: str
    overrides: dict[str, Any]
    weights: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)  # under the script's CONFIG


@dataclass(frozen=True)
class ModelLoaded:
    source: str
    display_name: str
    tree: Any  # gradscope.core.module_tree.ModuleTree
    layers: list[Any]  # LayerInfo of the engine's watch, in its column order
    settings: Any  # RunSettings as the engine took them
    device: str
    notes: list[str] = field(default_factory=list)
    # hf:/timm: models: the architecture as built (scaled-down sizes included).
    architecture: dict[str, Any] = field(default_factory=dict)
    # The settings the script alone gives (the app's defaults under its CONFIG, no user
    # override): what "Reset to script defaults" goes back to.
    script_settings: Any = None
    # What the watch says of its statistics (StatisticInfo: labels, schedules), by name.
    statistic_infos: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class StepRecord:
    """One engine step with the watch's layer layout at that step."""

    result: Any  # gradscope.core.runner.StepResult
    layer_names: tuple[str, ...]
    layer_types: tuple[str, ...]
    layer_params: tuple[int, ...]
    settings: Any = None  # the RunSettings the step ran with
    # The watch's parameters (the order of the step's param_grad_norm) and each one's layer.
    param_names: tuple[str, ...] = ()
    param_layers: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepsFinished:
    records: list[StepRecord]


@dataclass(frozen=True)
class WatchChanged:
    layers: list[Any]  # LayerInfo
    statistic_infos: list[Any] = field(default_factory=list)  # StatisticInfo of the new watch


@dataclass(frozen=True)
class RunPaused:
    """A run request ended. ``reason``: "requested" (Pause), "stopped" (Stop),
    "nonfinite" (the engine halted at a NaN/Inf), "warning" (the run's first early
    warning, with ``pause_at_warning``), "before_apply" (paused before the optimizer step:
    the gradients are complete, Apply continues), "completed" or "failed".
    ``rewind_steps``: the steps the run can go back to, ``snapshot_bytes`` what that keeps."""

    reason: str
    steps_done: int
    rewind_steps: list[int] = field(default_factory=list)
    snapshot_bytes: int = 0


@dataclass(frozen=True)
class RunRewound:
    """The engine went back to just before ``step``; later steps are gone."""

    step: int
    rewind_steps: list[int]
    snapshot_bytes: int


@dataclass(frozen=True)
class RunFailed:
    stage: str  # "load", "step" or "settings"
    message: str
    details: list[str] = field(default_factory=list)


def describe_error(error: BaseException) -> tuple[str, list[str]]:
    """The message and the user-facing traceback lines of an error."""
    from gradscope.core.errors import GradScopeError

    if isinstance(error, GradScopeError):
        return error.message, list(error.details)
    message = f"{type(error).__name__}: {error}".strip()
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    return message, [line.rstrip("\n") for line in "".join(lines).splitlines()[-12:]]


def _script_settings(loaded: Any, defaults: dict[str, Any], fallback: Any) -> Any:
    """The run settings of ``loaded`` without the user's overrides (see ModelLoaded)."""
    from gradscope.core.settings import settings_from_config

    try:
        settings = settings_from_config(loaded.config, settings_from_config(defaults or {}))
    except Exception:  # the load itself succeeded with these; never fail on the marks
        return fallback
    if loaded.image_size is not None and loaded.image_size != settings.image_size:
        settings = settings.replaced(image_size=loaded.image_size)
    return settings


class RunWorker(QObject):
    """Lives in the run thread. Slots run there; the flags and ``queue_settings`` are the
    only things the GUI thread calls directly."""

    model_loaded = Signal(object)  # ModelLoaded
    steps_finished = Signal(object)  # StepsFinished
    watch_changed = Signal(object)  # WatchChanged
    run_paused = Signal(object)  # RunPaused
    run_failed = Signal(object)  # RunFailed
    run_rewound = Signal(object)  # RunRewound

    def __init__(self) -> None:
        super().__init__()
        self.runner: Any = None
        # Stop each step after backward, before the optimizer (set from the GUI thread).
        self.pause_before_apply = False
        # Stop after the step that brings the run's first early warning (set from the GUI
        # thread); ``_first_warning_step`` is that step, once there is one.
        self.pause_at_warning = False
        self._first_warning_step: int | None = None
        self._lock = threading.Lock()
        self._pending_settings: Any = None
        self.stop_requested = False
        self.pause_requested = False
        # Cleared by the GUI thread while it redraws the plots during a run: the next step
        # waits for it (at most _GUI_WAIT_LIMIT), so that the redraw has the GIL and a core
        # to itself instead of sharing them with a training loop of small steps.
        self.gui_idle = threading.Event()
        self.gui_idle.set()
        self._layer_layout: tuple[Any, tuple, tuple, tuple, tuple, tuple] = (
            None,
            (),
            (),
            (),
            (),
            (),
        )
        # Module-by-module progress of long steps (read by the GUI thread), and the way to
        # abandon a step when the app quits.
        self.progress = StepProgress()
        self._last_step_seconds: float | None = None

    # -- called from the GUI thread ------------------------------------------------------
    def queue_settings(self, settings: Any) -> None:
        """New settings, taken before the next step."""
        with self._lock:
            self._pending_settings = settings

    def clear_flags(self) -> None:
        self.stop_requested = False
        self.pause_requested = False
        self.progress.abort_requested = False

    # -- slots, in the run thread ----------------------------------------------------------
    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        from gradscope.core.runner import StepRunner
        from gradscope.core.sources import load_with_settings

        # The model loaded now stays usable until the new one has loaded: a failed open
        # loses nothing.
        overrides = dict(request.overrides)
        if "image_size" in request.defaults and "image_size" not in overrides:
            # The model is built for its input size: a default size must reach the loader
            # (which raises it to what the model needs).
            overrides["image_size"] = request.defaults["image_size"]
        try:
            loaded, settings = load_with_settings(
                request.source,
                overrides,
                weights=request.weights,
                defaults=request.defaults,
            )
            runner = StepRunner(loaded, settings)
        except Exception as error:  # any failure of the user's model is shown
            message, details = describe_error(error)
            self.run_failed.emit(RunFailed("load", message, details))
            return
        self._close_runner()
        with self._lock:
            self._pending_settings = None
        self.runner = runner
        self._last_step_seconds = None
        self._first_warning_step = None
        layers = list(runner.watch.layers) if runner.watch is not None else []
        script_settings = _script_settings(loaded, request.defaults, runner.settings)
        self.model_loaded.emit(
            ModelLoaded(
                source=loaded.source,
                display_name=loaded.display_name,
                tree=runner.tree,
                layers=layers,
                settings=runner.settings,
                device=str(runner.device),
                notes=list(loaded.notes),
                architecture=dict(getattr(loaded, "architecture", None) or {}),
                script_settings=script_settings,
                statistic_infos=runner.statistic_infos,
            )
        )

    @Slot(int)
    def run(self, count: int) -> None:
        """Up to ``count`` steps; ends early on Pause, Stop, a halt at NaN/Inf or an error."""
        runner = self.runner
        if runner is None:
            self.run_paused.emit(RunPaused("failed", 0))
            return
        done = 0
        pending: list[StepRecord] = []
        last_emit = time.perf_counter()
        reason = "completed"
        # A halt is a breakpoint at the run's first NaN/Inf: continuing runs on (later
        # non-finite steps are still not applied, unless keep_going) instead of pausing again
        # after every step.
        runner.halted = False
        past_first_nonfinite = runner.first_nonfinite is not None
        # Likewise the first warning: Run after that pause goes on through later ones.
        past_first_warning = self._first_warning_step is not None
        if runner.pending_step is not None:
            # Paused before the optimizer step: Apply (or Run) applies it with the settings
            # as they are now (a clip or learning rate changed while paused counts).
            if not self._apply_pending_settings():
                self.run_paused.emit(self._paused("failed", 0))
                return
            try:
                runner.apply(runner.pending_step)
            except Exception as error:
                message, details = describe_error(error)
                self.run_failed.emit(RunFailed("step", message, details))
                self.run_paused.emit(self._paused("failed", 0))
                return
            if count <= 0:
                self.run_paused.emit(self._paused("completed", 0))
                return
        while done < count:
            if self.stop_requested:
                reason = "stopped"
                break
            if self.pause_requested:
                reason = "requested"
                break
            if not self._apply_pending_settings():
                reason = "failed"
                break
            if not self.gui_idle.is_set():
                self.gui_idle.wait(_GUI_WAIT_LIMIT)
            progress = self.progress
            progress.attach_if_useful(runner.model, self._last_step_seconds)
            progress.begin(runner.step_index)
            started = time.perf_counter()
            try:
                if self.pause_before_apply:
                    result = runner.compute()
                else:
                    result = runner.step()
            except StepAborted:  # the app is quitting: the step is abandoned
                reason = "stopped"
                break
            except Exception as error:  # shown to the user, the app goes on
                message, details = describe_error(error)
                self._emit_records(pending)
                self.run_failed.emit(RunFailed("step", message, details))
                reason = "failed"
                break
            finally:
                progress.end()
            self._last_step_seconds = time.perf_counter() - started
            done += 1
            pending.append(self._record(result))
            now = time.perf_counter()
            if now - last_emit >= _EMIT_INTERVAL:
                self._emit_records(pending)
                last_emit = now
            warned = result.stats is not None and bool(result.stats.warnings)
            if warned and self._first_warning_step is None:
                self._first_warning_step = result.step
            if runner.halted and not past_first_nonfinite:
                reason = "nonfinite"
                break
            runner.halted = False
            if runner.pending_step is not None:
                # Paused before the optimizer step anyway (the warning shows there too).
                reason = "nonfinite" if result.nonfinite else "before_apply"
                break
            if warned and self.pause_at_warning and not past_first_warning:
                reason = "warning"
                break
        self._emit_records(pending)
        self.run_paused.emit(self._paused(reason, done))

    @Slot(int)
    def rewind(self, step: int) -> None:
        """Go back to just before ``step`` (see StepRunner.rewind)."""
        runner = self.runner
        if runner is None:
            return
        try:
            runner.rewind(step)
        except Exception as error:
            message, details = describe_error(error)
            self.run_failed.emit(RunFailed("settings", message, details))
            self.run_paused.emit(self._paused("failed", 0))
            return
        if self._first_warning_step is not None and self._first_warning_step >= step:
            self._first_warning_step = None  # that step is gone: its warnings with it
        self.run_rewound.emit(RunRewound(step, runner.rewind_steps, runner.snapshot_bytes()))
        self.run_paused.emit(self._paused("requested", 0))

    def _paused(self, reason: str, done: int) -> RunPaused:
        runner = self.runner
        if runner is None:
            return RunPaused(reason, done)
        return RunPaused(reason, done, runner.rewind_steps, runner.snapshot_bytes())

    # -- helpers -------------------------------------------------------------------------
    def _record(self, result: Any) -> StepRecord:
        watch = self.runner.watch
        layers = watch.layers if watch is not None else []
        if self._layer_layout[0] is not layers:
            names = tuple(layer.name for layer in layers)
            param_names = tuple(watch.param_names) if watch is not None else ()
            self._layer_layout = (
                layers,
                names,
                tuple(layer.type_name for layer in layers),
                tuple(layer.num_params for layer in layers),
                param_names,
                tuple(owner_layers(param_names, [la.param_names for la in layers], names)),
            )
        _, names, types, params, param_names, param_layers = self._layer_layout
        return StepRecord(
            result, names, types, params, self.runner.settings, param_names, param_layers
        )

    def _emit_records(self, pending: list[StepRecord]) -> None:
        if pending:
            self.steps_finished.emit(StepsFinished(list(pending)))
            pending.clear()

    def _apply_pending_settings(self) -> bool:
        with self._lock:
            settings, self._pending_settings = self._pending_settings, None
        if settings is None:
            return True
        runner = self.runner
        current = runner.settings
        # The device, seed and image size belong to the model that was built; the GUI
        # offers a restart for them, so here they keep the run's values.
        fixed = {name: getattr(current, name) for name in RESTART_SETTINGS}
        watch_before = runner.watch.layers if runner.watch is not None else None
        try:
            runner.apply_settings(settings.replaced(**fixed))
        except Exception as error:  # a bad layer pattern, a bad value
            message, details = describe_error(error)
            self.run_failed.emit(RunFailed("settings", message, details))
            return False
        watch_after = runner.watch.layers if runner.watch is not None else None
        if watch_after is not watch_before:
            self.watch_changed.emit(WatchChanged(list(watch_after or []), runner.statistic_infos))
        return True

    def _close_runner(self) -> None:
        self.progress.detach()
        if self.runner is not None:
            self.runner.close()
            self.runner = None

    def close(self) -> None:
        """After the thread has finished: release the engine's hooks."""
        self._close_runner()


class RunThread(QObject):
    """Owns the run thread and its worker; the GUI talks to this object only.

    Shutdown is request-stop, ``quit()``, ``wait()``: the thread ends after the current
    step. It is never terminated.
    """

    load_requested = Signal(object)
    run_requested = Signal(int)
    rewind_requested = Signal(int)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("gradscope-run")
        self.worker = RunWorker()
        self.worker.moveToThread(self.thread)
        self.load_requested.connect(self.worker.load)
        self.run_requested.connect(self.worker.run)
        self.rewind_requested.connect(self.worker.rewind)
        self.busy = False
        self.thread.start()

    def load(self, request: LoadRequest) -> None:
        self.worker.stop_requested = True  # a run still going ends before the load
        self.busy = True
        self.load_requested.emit(request)

    def run(self, count: int) -> bool:
        """Start ``count`` steps unless a request is already going; True when started."""
        if self.busy or count < 0:
            return False
        self.busy = True
        self.worker.clear_flags()
        self.run_requested.emit(count)
        return True

    def apply_pending(self) -> bool:
        """Apply a step paused before its optimizer update, and take no further step."""
        if self.busy:
            return False
        self.busy = True
        self.worker.clear_flags()
        self.run_requested.emit(0)
        return True

    def rewind(self, step: int) -> bool:
        if self.busy:
            return False
        self.busy = True
        self.rewind_requested.emit(step)
        return True

    def mark_idle(self) -> None:
        self.busy = False

    def pause(self) -> None:
        self.worker.pause_requested = True

    def stop(self) -> None:
        """Stop the run as Quit does: a long step going on is abandoned at its next module
        boundary (it waited for the whole step, 8-9 s on convnext_tiny); Run after Stop
        starts afresh, so the abandoned step's model is not used again."""
        self.worker.stop_requested = True
        self.worker.progress.abort()

    def queue_settings(self, settings: Any) -> None:
        self.worker.queue_settings(settings)

    def shutdown(self) -> None:
        """End the thread: a long step going on is abandoned at its next module boundary
        (the model is not used again), so that quitting does not wait for it."""
        if not self.thread.isRunning():
            return
        self.worker.stop_requested = True
        self.worker.progress.abort()
        self.thread.quit()
        self.thread.wait()
        self.worker.close()
