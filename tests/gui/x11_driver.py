"""The app under a real X server, for test_x11_smoke.py: run as a separate process (the test
session's own QApplication is offscreen). It sets a scene up, prints ``READY <window id>``,
then reports what the keys the test sends with xdotool did, one line each, and exits.

``python x11_driver.py shortcuts MODEL``: a model with a run behind it, the cursor in the
learning-rate field; Ctrl+Z must reach Rewind ("REWIND ..."), Ctrl+E Export ("EXPORT ...").
``python x11_driver.py quit MODEL``: a run of slow steps going on; Ctrl+Q must close the
window at once ("CLOSED <seconds>") and the process must end.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> int:
    scene, model = sys.argv[1], sys.argv[2]
    os.environ["QT_QPA_PLATFORM"] = "xcb"
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog

    from gradscope.gui.app import make_application
    from gradscope.gui.main_window import MainWindow

    app = make_application()
    folder = Path(os.environ["GRADSCOPE_TEST_FOLDER"])
    window = MainWindow(
        QSettings(str(folder / "prefs.ini"), QSettings.Format.IniFormat), persist=False
    )
    window.resize(1280, 800)
    window.show()

    def say(*words: object) -> None:
        print(*words, flush=True)

    def ready() -> None:
        window.activateWindow()
        window.raise_()
        say("READY", int(window.winId()))

    if scene == "shortcuts":

        def get_item(*_args: object) -> tuple[str, bool]:
            say("REWIND", window.settings_panel.lr.text())
            QTimer.singleShot(200, app.quit)
            return "", False

        def get_save_file_name(*_args: object, **_kwargs: object) -> tuple[str, str]:
            say("EXPORT", window.settings_panel.lr.text())
            return "", ""

        QInputDialog.getItem = staticmethod(get_item)  # type: ignore[method-assign]
        QFileDialog.getSaveFileName = staticmethod(get_save_file_name)  # type: ignore[method-assign]

        def on_paused(_payload: object) -> None:
            window.run_paused.disconnect(on_paused)
            window.settings_dock.raise_()
            field = window.settings_panel.lr
            field.setFocus()
            field.selectAll()
            QTimer.singleShot(300, ready)

        window.run_paused.connect(on_paused)
        window.open_model(model, {"rewind_depth": 5}, run_after_load=True)
    elif scene == "quit":
        closed_at: list[float] = []
        window.destroyed.connect(lambda: None)

        def watch_progress() -> None:
            if window.run_thread.worker.progress.snapshot() is not None:
                ready()
            else:
                QTimer.singleShot(100, watch_progress)

        def on_loaded(_payload: object) -> None:
            QTimer.singleShot(100, watch_progress)

        original_close = window.closeEvent

        def close_event(event: object) -> None:
            started = time.perf_counter()
            original_close(event)  # type: ignore[arg-type]
            closed_at.append(time.perf_counter() - started)
            say("CLOSED", f"{closed_at[0]:.2f}")

        window.closeEvent = close_event  # type: ignore[method-assign]
        window.model_loaded.connect(on_loaded)
        window.open_model(model, run_after_load=True)
    else:
        raise SystemExit(f"unknown scene {scene!r}")
    QTimer.singleShot(60_000, app.quit)  # never hang a test run
    app.exec()
    window.run_thread.shutdown()
    say("EXIT")
    QApplication.processEvents()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
