"""The window's size and place as restored from the last session, made to fit the screen it
opens on (a window saved on a larger screen was taller than a 1280x800 one, its status bar
off the edge)."""

from __future__ import annotations

from PySide6.QtCore import QRect
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget


def fit_to_screen(window: QWidget) -> bool:
    """Shrink and move ``window`` (frame included) into its screen's available area; True
    when it had to change."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    if screen is None:
        return False
    available = screen.availableGeometry()
    frame = window.frameGeometry()
    extra_width = frame.width() - window.width()
    extra_height = frame.height() - window.height()
    width = min(frame.width(), available.width())
    height = min(frame.height(), available.height())
    left = min(max(frame.left(), available.left()), available.right() - width + 1)
    top = min(max(frame.top(), available.top()), available.bottom() - height + 1)
    fitted = QRect(left, top, width, height)
    if fitted == frame:
        return False
    if window.isMaximized() or window.isFullScreen():
        return False  # the window system sizes those
    window.resize(max(1, width - extra_width), max(1, height - extra_height))
    window.move(left, top)
    return True
