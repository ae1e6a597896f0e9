"""The guard against PySide6 6.12.0 dropping references to None on Python 3.11."""

from __future__ import annotations

import subprocess
import sys

from PySide6.QtWidgets import QWidget

from gradscope.gui import pyside_compat


def test_many_void_qt_calls_do_not_free_none(qapp) -> None:
    pyside_compat.guard_singletons()
    widget = QWidget()
    before = sys.getrefcount(None)
    for _ in range(10_000):
        widget.update()
    # With the guard (or a PySide6 without the bug) None's count stays far above zero.
    assert sys.getrefcount(None) > 1_000 or sys.getrefcount(None) >= before


def test_a_process_making_many_void_calls_exits_cleanly() -> None:
    code = (
        "import os; os.environ['QT_QPA_PLATFORM'] = 'offscreen'\n"
        "import sys\n"
        "from PySide6.QtWidgets import QApplication, QWidget\n"
        "n = sys.getrefcount(None) + 1000  # enough to free an unguarded None\n"
        "import gradscope.gui\n"
        "app = QApplication([]); w = QWidget()\n"
        "for _ in range(n): w.update()\n"
        "print('done')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "done" in result.stdout
