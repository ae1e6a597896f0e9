"""Dialogs: errors (message plus the user's traceback lines), the torchvision model picker
and About. Dialogs are opened window-modal with ``open()``, never ``exec()``, so a run in
the background, a scripted screenshot and the tests are never blocked by one."""

from __future__ import annotations

import platform

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QLineEdit,
    QListWidget,
    QMessageBox,
    QPlainTextEdit,
    QStyle,
    QVBoxLayout,
    QWidget,
)


class ErrorDialog(QDialog):
    """The message in bold, then the relevant lines of the user's traceback, visible at once
    (not behind a "Show details" button)."""

    def __init__(self, parent: QWidget | None, title: str, message: str,
                 details: list[str]) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        self.message = message
        self.details = list(details)
        layout = QVBoxLayout(self)
        icon = QLabel()
        icon.setPixmap(self.style().standardIcon(
            QStyle.StandardPixmap.SP_MessageBoxCritical).pixmap(32, 32))
        text = QLabel(message)
        text.setWordWrap(True)
        font = QFont()
        font.setBold(True)
        text.setFont(font)
        text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(icon)
        layout.addWidget(text)
        if details:
            self.traceback = QPlainTextEdit("\n".join(details))
            self.traceback.setReadOnly(True)
            self.traceback.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
            self.traceback.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            self.traceback.setMinimumHeight(120)
            layout.addWidget(self.traceback, 1)
        hint = QLabel("The app keeps running; the history so far stays on screen. "
                      "Fix the script and use Run ▸ Restart (or File ▸ Open) to try again.")
        hint.setWordWrap(True)
        hint.setStyleSheet("color: #666;")
        layout.addWidget(hint)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        buttons.accepted.connect(self.accept)
        layout.addWidget(buttons)
        self.resize(720, 360 if details else 180)


class TorchvisionDialog(QDialog):
    """A searchable list of torchvision's classification models."""

    def __init__(self, parent: QWidget | None, names: list[str]) -> None:
        super().__init__(parent)
        self.setWindowTitle("Open torchvision model")
        layout = QVBoxLayout(self)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search models (e.g. resnet, vit, mobilenet)")
        self.search.setClearButtonEnabled(True)
        self.list = QListWidget()
        self.list.addItems(names)
        if names:
            self.list.setCurrentRow(0)
        note = QLabel("Built with random weights (nothing is downloaded); the input size "
                      "comes from the run settings or the model's requirement.")
        note.setWordWrap(True)
        note.setStyleSheet("color: #666;")
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addWidget(note)
        layout.addWidget(buttons)
        self.search.textChanged.connect(self._on_search_text_changed)
        self.list.itemDoubleClicked.connect(lambda _item: self.accept())
        self.resize(380, 480)

    def _on_search_text_changed(self, text: str) -> None:
        needle = text.strip().lower()
        first = None
        for row in range(self.list.count()):
            item = self.list.item(row)
            hidden = needle not in item.text().lower()
            item.setHidden(hidden)
            if not hidden and first is None:
                first = row
        if first is not None:
            self.list.setCurrentRow(first)

    def selected_name(self) -> str | None:
        item = self.list.currentItem()
        return item.text() if item is not None and not item.isHidden() else None


def versions_text() -> str:
    import numpy
    import pyqtgraph
    import PySide6
    from PySide6.QtCore import qVersion

    import gradscope

    try:
        import torch

        torch_text = torch.__version__
        cuda = torch.version.cuda or "none (CPU build)"
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_text, cuda = "not installed", "-"
    return (
        f"GradScope {gradscope.__version__}<br>"
        f"torch {torch_text} (CUDA {cuda})<br>"
        f"Qt {qVersion()}, PySide6 {PySide6.__version__}<br>"
        f"pyqtgraph {pyqtgraph.__version__}, numpy {numpy.__version__}<br>"
        f"Python {platform.python_version()}"
    )


def show_about(parent: QWidget) -> QMessageBox:
    box = QMessageBox(parent)
    box.setWindowTitle("About GradScope")
    box.setTextFormat(Qt.TextFormat.RichText)
    box.setText("<b>GradScope</b>: see where a PyTorch run's gradients explode, vanish or "
                "turn NaN/Inf.<br><br>" + versions_text())
    box.setIcon(QMessageBox.Icon.Information)
    box.open()
    return box
