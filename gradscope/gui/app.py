"""Start the app: ``gradscope [MODEL] [--steps N] [--screenshot PATH.png] [run options]``.

With ``--screenshot`` the window opens, runs N steps (or until the run pauses itself, e.g.
at a NaN/Inf, which then shows on screen), saves a picture of the whole window and exits.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ORGANIZATION = "GradScope"
APPLICATION = "GradScope"
DEFAULT_SIZE = (1440, 900)
DEFAULT_SAMPLE = Path(__file__).resolve().parents[2] / "sample_models" / "seed_explosion.py"
SCREENSHOT_TIMEOUT_S = 600


def _window_size() -> tuple[int, int]:
    """``GRADSCOPE_WINDOW_SIZE=1280x800`` sets the window size (screenshots at set sizes);
    otherwise DEFAULT_SIZE, made to fit the screen (a 1280x800 laptop gets its whole screen,
    not a window running off its edges)."""
    text = os.environ.get("GRADSCOPE_WINDOW_SIZE", "")
    try:
        width, height = (int(part) for part in text.lower().split("x"))
        return max(width, 400), max(height, 300)
    except ValueError:
        pass
    from PySide6.QtGui import QGuiApplication

    screen = QGuiApplication.primaryScreen()
    if screen is None:
        return DEFAULT_SIZE
    room = screen.availableGeometry()
    return min(DEFAULT_SIZE[0], room.width()), min(DEFAULT_SIZE[1], room.height())


def make_application(argv: list[str] | None = None) -> Any:
    """The QApplication (made once), with the app's names, style and plot look."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        app = QApplication(argv if argv is not None else [sys.argv[0]])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setStyle("Fusion")
    configure_plots()
    from gradscope.gui import file_dialog_columns

    file_dialog_columns.install(app)
    return app


def configure_plots() -> None:
    import warnings

    import pyqtgraph as pg

    # pyqtgraph's scatter items take their bounds with nanmin/nanmax (its curves silence
    # that themselves); points that are NaN in full are normal here, a NaN is drawn as a
    # marker: no terminal full of "All-NaN slice encountered" (about 40 in an hour).
    warnings.filterwarnings(
        "ignore", "All-NaN slice encountered", RuntimeWarning, module=r"pyqtgraph\."
    )

    pg.setConfigOptions(
        background="w", foreground="#333", antialias=True, imageAxisOrder="col-major"
    )


def _runs_user_code(source: str) -> bool:
    """Opening ``source`` imports a model script that is not one of GradScope's samples
    (a torchvision, ``hf:`` or ``timm:`` name builds a model without running user code)."""
    if not source.endswith(".py"):
        return False
    return Path(source).resolve().parent != DEFAULT_SAMPLE.parent


def _builds_a_zoo_model(source: str) -> bool:
    """An ``hf:``/``timm:`` name: often 100M+ parameters, a minute to build on a CPU
    (`gradscope` with no argument rebuilt hf:bert's 110M unasked)."""
    return source.startswith(("hf:", "timm:"))


def script_to_offer(preferences: Any) -> str | None:
    """The last model, when it is a script of the user's that still exists, or an
    ``hf:``/``timm:`` model: the app does not import or build it unasked at start (a script
    may train, download, or be the one that crashed the app; a zoo model may take a minute),
    it offers File > Reopen instead."""
    last = str(preferences.value("model/last", "") or "")
    if last and _builds_a_zoo_model(last):
        return last
    return last if last and _runs_user_code(last) and Path(last).exists() else None


def default_model(preferences: Any) -> str | None:
    """What the app opens at start without arguments: the last model when it is a
    torchvision name or a sample; nothing when it is a script of the user's or an
    ``hf:``/``timm:`` model (see script_to_offer); the default sample when there was none."""
    last = str(preferences.value("model/last", "") or "")
    if (
        last
        and not _runs_user_code(last)
        and not _builds_a_zoo_model(last)
        and (not last.endswith(".py") or Path(last).exists())
    ):
        return last
    if script_to_offer(preferences) is not None:
        return None
    return str(DEFAULT_SAMPLE) if DEFAULT_SAMPLE.exists() else None


def offer_reopen(
    window: Any, script: str, overrides: dict[str, Any], weights: str | None = None
) -> Any:
    """File > "Reopen NAME" (first in the menu) and a status-bar line saying so."""
    from PySide6.QtGui import QAction

    name = Path(script).name
    action = QAction(f"Reopen {name}", window)
    action.setStatusTip(f"Open {script} again (it was the last model)")
    action.triggered.connect(lambda _=False: window.open_model(script, overrides, weights))
    first = window.file_menu.actions()[0] if window.file_menu.actions() else None
    window.file_menu.insertAction(first, action)
    window.reopen_action = action
    window.statusBar().showMessage(
        f"Your last model, {name}, is one click away: File ▸ Reopen {name}", 30000
    )
    return action


def launch(
    model: str | None,
    overrides: dict[str, Any],
    weights: str | None = None,
    screenshot: str | None = None,
    recording: str | None = None,
    compare: list[str] | None = None,
    statistic: str | None = None,
) -> int:
    """Open the window on ``model`` (or the last one, or the default sample), or on a
    ``recording`` (``gradscope open RECORDING``) with the ``compare`` recordings drawn on
    the same axes; ``statistic``: the one the gradient-norm plot shows (a built-in or one of
    the recording's named statistics)."""
    from gradscope.gui.system_check import startup_problem

    problem = startup_problem()
    if problem is not None:  # Qt would abort with a message that does not say what to do
        print(problem, file=sys.stderr)
        return 2  # a set-up problem for the user to fix (the exit-code contract), no bug

    from PySide6.QtCore import QSettings, QTimer

    from gradscope.gui.main_window import MainWindow

    app = make_application()
    preferences = QSettings()
    window = MainWindow(preferences, persist=screenshot is None)
    if screenshot is None:
        if not window.restore_geometry():
            window.resize(*_window_size())
            window.fit_to_screen_when_shown()
    else:
        window.resize(*_window_size())
    window.show()
    # Everything made so far (torch, Qt, the window) lives as long as the app: move it out of
    # the garbage collector's way, so full collections (100+ ms here) do not stall the GUI.
    window.garbage_collector.settle()
    source = None if recording else (model or default_model(preferences))
    if source is None and not recording and (script := script_to_offer(preferences)):
        offer_reopen(window, script, overrides, weights)
    exit_code = {"value": 0}

    if screenshot is not None:

        def save_and_quit() -> None:
            window.save_screenshot(screenshot)
            window.close()
            app.quit()

        def on_paused(_payload: object) -> None:
            QTimer.singleShot(300, save_and_quit)

        def on_error(payload: Any) -> None:
            if payload.stage == "load":
                exit_code["value"] = 2
                QTimer.singleShot(300, save_and_quit)

        window.run_paused.connect(on_paused)
        window.error_shown.connect(on_error)
        QTimer.singleShot(SCREENSHOT_TIMEOUT_S * 1000, save_and_quit)
        if source is None:
            QTimer.singleShot(300, save_and_quit)

    if recording is not None:
        if not window.recordings.open_recording(recording):
            exit_code["value"] = 2
        elif statistic is not None:
            window.plots.show_statistic(statistic, window.history)
        for other in compare or ():
            if not window.comparison.add_recording(other):
                exit_code["value"] = 2
        if screenshot is not None:
            QTimer.singleShot(800, save_and_quit)
    if source is not None:
        window.open_model(source, overrides, weights, run_after_load=screenshot is not None)
    app.exec()
    window.run_thread.shutdown()
    return exit_code["value"]
