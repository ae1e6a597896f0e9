"""A window restored from a session on a larger screen fits the screen it opens on
(issue 27: at 1280x800 it was taller than the screen, its status bar off the edge)."""

from __future__ import annotations

from gradscope.gui.window_geometry import fit_to_screen


def test_a_window_larger_than_the_screen_is_fitted_into_it(qtbot, window) -> None:
    available = window.screen().availableGeometry()
    window.resize(available.width() + 900, available.height() + 700)
    window.move(available.left() + 300, available.top() + 200)
    assert window.frameGeometry().height() > available.height()
    assert fit_to_screen(window)
    frame = window.frameGeometry()
    assert available.contains(frame), (frame, available)
    assert frame.height() == available.height() and frame.width() == available.width()
    assert not fit_to_screen(window)  # fitted: nothing more to do


def test_restored_geometry_fits_the_screen(qtbot, window, preferences) -> None:
    from gradscope.gui.main_window import MainWindow

    available = window.screen().availableGeometry()
    window.resize(available.width() + 900, available.height() + 700)
    preferences.setValue("window/geometry", window.saveGeometry())
    restored = MainWindow(preferences)
    qtbot.addWidget(restored)
    assert restored.restore_geometry()
    restored.show()
    qtbot.waitExposed(restored)
    qtbot.waitUntil(lambda: available.contains(restored.frameGeometry()), timeout=3_000)
    frame = restored.frameGeometry()
    assert frame.height() <= available.height() and frame.width() <= available.width()
    assert available.contains(frame)
    restored.close()


def test_a_window_closed_at_once_leaves_no_fitting_behind(qtbot, window, preferences) -> None:
    """The second fit, once the frame is known, must not run on a window already gone
    (it raised 'Internal C++ object already deleted' in the next test)."""
    from PySide6.QtCore import QTimer

    from gradscope.gui.main_window import MainWindow

    preferences.setValue("window/geometry", window.saveGeometry())
    restored = MainWindow(preferences)
    assert restored.restore_geometry()
    restored.show()
    restored.close()
    restored.deleteLater()
    qtbot.wait(50)
    fired = []
    QTimer.singleShot(400, lambda: fired.append(True))
    qtbot.waitUntil(lambda: bool(fired), timeout=3_000)  # past the 300 ms fit: no error
