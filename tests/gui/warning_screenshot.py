"""The README's screenshot of an early warning in the app, on a real X display:

    Xvfb :99 -screen 0 1920x1080x24 &
    DISPLAY=:99 python tests/gui/warning_screenshot.py OUT.png 1280x800

The LM head of tests/models/drift_cases.py in float16 without z-loss (the script of
test_early_warnings_in_app.py) runs 60 steps with early warnings on; the head's
log-partition drifts from step 49, long before exp overflows (step 94). The picture shows the
head gold in the tree, the warning in Events, and the log-partition plotted with float16
exp's limit and the dotted projection to it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    out, size = sys.argv[1], sys.argv[2]
    width, height = (int(part) for part in size.split("x"))
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb")
    sys.path.insert(0, str(ROOT))
    from PySide6.QtCore import QSettings, QTimer

    from gradscope.gui.app import make_application
    from gradscope.gui.main_window import MainWindow
    from tests.gui.test_early_warnings_in_app import LM_HEAD

    folder = Path(tempfile.mkdtemp(prefix="gradscope-warning-shot-"))
    script = folder / "lm_head_without_z_loss.py"
    script.write_text(LM_HEAD.format(root=str(ROOT)))
    app = make_application()
    window = MainWindow(
        QSettings(str(folder / "prefs.ini"), QSettings.Format.IniFormat), persist=False
    )
    window.resize(width, height)
    window.show()
    done = {"code": 1}

    def shoot() -> None:
        # The head's curve highlighted, its tree row and the Events row left unselected:
        # a selected row's highlight would hide their warning tint.
        window.plots.gradient_norm.statistic_selector.choose("out_log_partition")
        window.selected_layer = "head"
        window._refresh()
        done["code"] = 0 if window.save_screenshot(out) else 1
        QTimer.singleShot(100, app.quit)

    window.run_paused.connect(lambda _payload: QTimer.singleShot(500, shoot))
    window.open_model(str(script), {"early_warnings": True, "steps": 60}, run_after_load=True)
    QTimer.singleShot(120_000, app.quit)
    app.exec()
    window.run_thread.shutdown()
    return done["code"]


if __name__ == "__main__":
    sys.exit(main())
