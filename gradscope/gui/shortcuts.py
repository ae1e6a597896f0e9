"""Keyboard shortcuts that work wherever the focus is, and the list of them (Help menu).

Qt first offers a key to the focused widget as a ``ShortcutOverride`` event: a text field
accepts Ctrl+Z (its own undo), so with the cursor in a settings field Ctrl+Z undid the edit
instead of rewinding, and Ctrl+E did nothing. :class:`ShortcutRouter`, an application event
filter, decides instead:

- a shortcut with Ctrl or Alt, or on a function key, of an enabled window action goes to the
  action whatever has the focus (typing keys stay the field's: Ctrl+A/C/V/X/Y);
- a plain key of a window action (Left/Right/F walk a trace, End follows the latest step) goes
  to the action unless the focused widget needs it itself: a text field (typing, moving the
  cursor), a list or tree (moving through rows), a slider.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLineEdit,
    QMainWindow,
    QPlainTextEdit,
    QTableWidget,
    QTableWidgetItem,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

_COMMAND_MODIFIERS = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier
# Editing keys a text field keeps even with Ctrl held (made once a QApplication exists:
# platform key bindings need it).
_TEXT_EDITING_KEYS = (
    QKeySequence.StandardKey.SelectAll,
    QKeySequence.StandardKey.Copy,
    QKeySequence.StandardKey.Paste,
    QKeySequence.StandardKey.Cut,
    QKeySequence.StandardKey.Redo,
)


def _is_text_editing(sequence: QKeySequence) -> bool:
    return any(
        sequence == bound for key in _TEXT_EDITING_KEYS for bound in QKeySequence.keyBindings(key)
    )


def _is_function_key(key: int) -> bool:
    return Qt.Key.Key_F1.value <= key <= Qt.Key.Key_F35.value


def _needs_plain_keys(widget: QWidget | None) -> bool:
    """The widget uses plain keys itself (typing, cursor moves, moving through rows)."""
    if widget is None:
        return False
    if isinstance(widget, QComboBox):
        return widget.isEditable()
    if isinstance(widget, (QLineEdit, QAbstractSpinBox, QAbstractItemView, QAbstractSlider)):
        return True
    if isinstance(widget, (QPlainTextEdit, QTextEdit)):
        return True
    return False


class ShortcutRouter(QObject):
    """See the module docstring. Installed on the application by the main window."""

    def __init__(self, window: QMainWindow) -> None:
        super().__init__(window)
        self.window = window

    def _action_for(self, sequence: QKeySequence) -> QAction | None:
        for action in self.window.findChildren(QAction):
            if action.isEnabled() and any(s == sequence for s in action.shortcuts()):
                return action
        return None

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.ShortcutOverride or not isinstance(event, QKeyEvent):
            return False
        if not isinstance(watched, QWidget) or isinstance(watched.window(), QDialog):
            return False  # a dialog keeps its keys
        if watched is not self.window and not self.window.isAncestorOf(watched):
            return False
        combination = event.keyCombination()
        sequence = QKeySequence(combination)
        action = self._action_for(sequence)
        if action is None:
            return False
        command = bool(event.modifiers() & _COMMAND_MODIFIERS) or _is_function_key(event.key())
        if command:
            if _is_text_editing(sequence) and _needs_plain_keys(watched):
                return False
            event.ignore()  # not the widget's: the action's shortcut fires
            return True
        if _needs_plain_keys(watched):
            event.accept()  # the widget's own key (a tree's Left collapses a row)
            return True
        event.ignore()
        return True


def install(window: QMainWindow) -> ShortcutRouter:
    router = ShortcutRouter(window)
    app = QApplication.instance()
    if app is not None:
        app.installEventFilter(router)
    return router


def shortcut_rows(window: QMainWindow) -> list[tuple[str, str]]:
    """(what, keys) for every window action with a shortcut, in menu order, then the rest."""
    seen: set[int] = set()
    rows: list[tuple[str, str]] = []

    def add(action: QAction) -> None:
        if id(action) in seen or action.isSeparator():
            return
        seen.add(id(action))
        keys = ", ".join(
            s.toString(QKeySequence.SequenceFormat.NativeText) for s in action.shortcuts()
        )
        if keys:
            rows.append((action.text().replace("&", "").rstrip("…"), keys))

    def walk(actions: list[QAction]) -> None:
        for action in actions:
            menu = action.menu()
            if menu is not None:
                walk(menu.actions())
            else:
                add(action)

    walk(window.menuBar().actions())
    for action in window.findChildren(QAction):
        add(action)
    return rows


class ShortcutsDialog(QDialog):
    """Help > Keyboard shortcuts: every shortcut of the window, from its actions."""

    def __init__(self, window: QMainWindow) -> None:
        super().__init__(window)
        self.setWindowTitle("Keyboard shortcuts")
        rows = shortcut_rows(window)
        self.table = QTableWidget(len(rows), 2)
        self.table.setHorizontalHeaderLabels(["Command", "Keys"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        for row, (what, keys) in enumerate(rows):
            self.table.setItem(row, 0, QTableWidgetItem(what))
            self.table.setItem(row, 1, QTableWidgetItem(keys))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        self.resize(460, 560)

    def rows(self) -> list[tuple[str, str]]:
        return [
            (self.table.item(r, 0).text(), self.table.item(r, 1).text())
            for r in range(self.table.rowCount())
        ]
