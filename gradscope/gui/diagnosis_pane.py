"""The diagnosis pane: where the first NaN/Inf came from, the values that led there, the hint,
and the user's source file opened read-only at that line."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QTextCursor, QTextFormat
from PySide6.QtWidgets import (
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QSplitter,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from gradscope.core.diagnosis import explain
from gradscope.core.facts import Origin

_HIGHLIGHT = QColor("#fbd5d5")


def display_path(file: str) -> str:
    """A source path as a person reads it: relative to the working folder when inside it,
    with ~ for the home folder otherwise."""
    path = Path(file)
    try:
        folder = Path.cwd().resolve()
        if folder.parent != folder:  # not from the root folder
            return str(path.resolve().relative_to(folder))
    except (ValueError, OSError):
        pass
    try:
        return "~/" + str(path.resolve().relative_to(Path.home().resolve()))
    except (ValueError, OSError, RuntimeError):
        return file


class DiagnosisPane(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary = QLabel("No NaN/Inf so far.")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(self.summary.textFormat().PlainText)
        self.location = QLabel("")
        self.source = QPlainTextEdit()
        self.source.setReadOnly(True)
        self.source.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        font = QFont("monospace")
        font.setStyleHint(QFont.StyleHint.Monospace)
        self.source.setFont(font)
        # The explanation scrolls, and a splitter shares the height with the source: in a
        # short dock (1280x800 with the trace open) the label was cut, not scrollable.
        self.summary.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(self.summary)
        bottom = QWidget()
        bottom_layout = QVBoxLayout(bottom)
        bottom_layout.setContentsMargins(0, 0, 0, 0)
        bottom_layout.addWidget(self.location)
        bottom_layout.addWidget(self.source, 1)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(scroll)
        splitter.addWidget(bottom)
        splitter.setChildrenCollapsible(False)
        splitter.setStretchFactor(1, 1)  # extra height goes to the source file
        self.splitter = splitter
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(splitter)
        self.origin: Origin | None = None
        self.highlighted_line: int | None = None

    def show_origin(self, origin: Origin | None) -> None:
        self.origin = origin
        self.highlighted_line = None
        # The last origin's highlighted line goes with its file (it stayed, an empty pink
        # line, when the next origin had no source).
        self.source.setExtraSelections([])
        if origin is None:
            self.summary.setText("No NaN/Inf so far.")
            self.location.setText("")
            self.source.setPlainText("")
            return
        summary = "\n".join(explain(origin))
        if origin.file:
            summary = summary.replace(origin.file, display_path(origin.file))
        self.summary.setText(summary)
        self._balance()
        if not origin.file:
            self.location.setText(_no_line_reason(origin))
            self.source.setPlainText("")
            return
        self.location.setText(f"{display_path(origin.file)}:{origin.line}")
        try:
            text = Path(origin.file).read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            self.source.setPlainText(f"cannot read {origin.file}: {error}")
            return
        self.source.setPlainText(text)
        self._highlight(origin.line or 1)

    def _balance(self) -> None:
        """The explanation gets the height it needs (at most 60%), the source the rest."""
        total = sum(self.splitter.sizes())
        if total <= 0:
            return
        width = max(self.width() - 40, 50)  # the scroll bar and margins
        needed = self.summary.heightForWidth(width) + 12
        top = max(40, min(needed, int(total * 0.6)))
        self.splitter.setSizes([top, total - top])

    def resizeEvent(self, event: object) -> None:
        super().resizeEvent(event)
        self._balance()

    def _highlight(self, line: int) -> None:
        block = self.source.document().findBlockByLineNumber(max(line - 1, 0))
        cursor = QTextCursor(block)
        selection = QTextEdit.ExtraSelection()
        selection.format.setBackground(_HIGHLIGHT)
        selection.format.setProperty(QTextFormat.Property.FullWidthSelection, True)
        selection.cursor = cursor
        self.source.setExtraSelections([selection])
        self.source.setTextCursor(cursor)
        self.source.centerCursor()
        self.highlighted_line = block.blockNumber() + 1


def _no_line_reason(origin: Origin) -> str:
    """Why an origin names no line of the user's code, in the words that fit it."""
    if origin.phase == "input":
        return "(no source line: the NaN/Inf came in the batch, your data)"
    if (origin.details.get("evidence") or {}).get("default_loss"):
        return "(no source line: GradScope's default loss made it; your script has no loss_fn)"
    if origin.phase == "unknown":
        return "(no source line: the origin was not located)"
    return "(no source line: the operation ran where the tracer saw no Python line of yours)"
