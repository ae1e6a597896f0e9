"""Qt's own file dialogs (used where the desktop offers no native one) with their Size, Type
and Date columns wide enough for what they show: at its default width the dialog cut them
to "156...KiB" and "SQL...ase". Every file dialog of the app gets this, the static
``QFileDialog.getOpenFileName`` ones included, from one event filter on the application."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QFileDialog, QHeaderView, QTreeView

# Wide enough for a long name beside the three other columns (Qt's default is about 600).
_WIDTH = 860
_HEIGHT = 520


def fit_columns(dialog: QFileDialog) -> None:
    """Widen ``dialog`` (within its screen) and size its detail view's columns to their
    contents."""
    view = dialog.findChild(QTreeView)
    if view is None:  # a native dialog: the desktop's own
        return
    screen = dialog.screen() or QGuiApplication.primaryScreen()
    if screen is not None:
        room = screen.availableGeometry()
        width = min(_WIDTH, int(room.width() * 0.9))
        height = min(_HEIGHT, int(room.height() * 0.9))
        if dialog.width() < width or dialog.height() < height:
            dialog.resize(max(dialog.width(), width), max(dialog.height(), height))
    # Sized to their contents by the header itself, as rows and their sizes arrive (a
    # folder is listed in a thread, sizes after names: a one-off resize came too early);
    # the name takes the rest.
    header = view.header()
    header.setStretchLastSection(False)
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    for column in range(1, header.count()):
        header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)


class FileDialogColumns(QObject):
    """Fits each Qt file dialog as it is shown (see the module docstring)."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Show and isinstance(watched, QFileDialog):
            fit_columns(watched)
        return False


def install(app: QApplication) -> FileDialogColumns:
    """Install the filter once on ``app``; returns it (kept alive by the application)."""
    existing = app.findChild(FileDialogColumns)
    if existing is not None:
        return existing
    columns = FileDialogColumns(app)
    app.installEventFilter(columns)
    return columns
