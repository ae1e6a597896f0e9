"""Dialogs: errors (message plus the user's traceback lines), the model picker (torchvision,
transformers, timm)
and About. Dialogs are opened window-modal with ``open()``, never ``exec()``, so a run in
the background, a scripted screenshot and the tests are never blocked by one."""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import ClassVar

from PySide6.QtCore import QObject, Qt, QThread, Signal
from PySide6.QtGui import QFont, QFontDatabase
from PySide6.QtWidgets import (
    QComboBox,
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

    SCRIPT_HINT = (
        "The app keeps running; the history so far stays on screen. "
        "Fix the script and use Run ▸ Restart (or File ▸ Open) to try again."
    )

    def __init__(
        self,
        parent: QWidget | None,
        title: str,
        message: str,
        details: list[str],
        hint: str = SCRIPT_HINT,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        self.message = message
        self.details = list(details)
        layout = QVBoxLayout(self)
        icon = QLabel()
        icon.setPixmap(
            self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxCritical).pixmap(32, 32)
        )
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
        hint_label = QLabel(hint)
        hint_label.setWordWrap(True)
        hint_label.setStyleSheet("color: #666;")
        layout.addWidget(hint_label)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        buttons.accepted.connect(self.accept)
        layout.addWidget(buttons)
        self.resize(720, 360 if details else 180)


# The libraries the dialog offers, by the prefix of their model names. transformers' and
# timm's names are listed only when asked (importing either takes seconds), in a thread.
LIBRARIES = (("torchvision", ""), ("transformers (hf:)", "hf:"), ("timm (timm:)", "timm:"))


class ZooNameLister(QThread):
    """Lists one prefix's names (``gradscope.core.zoo.zoo_model_names``) off the GUI thread;
    no model is built. ``listed`` carries the prefix, the names, and a message instead of
    names when the library is missing (the extra's pip line) or fails."""

    listed = Signal(str, list, str)
    cache: ClassVar[dict[str, list[str]]] = {}  # names by prefix, listed once a session

    def __init__(self, prefix: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.prefix = prefix

    def run(self) -> None:
        from gradscope.core.errors import GradScopeError
        from gradscope.core.zoo import zoo_model_names

        try:
            names = zoo_model_names(self.prefix)
        except GradScopeError as error:
            self.listed.emit(self.prefix, [], error.message)
            return
        except Exception as error:  # a broken install: say so, the dialog stays usable
            self.listed.emit(self.prefix, [], f"{type(error).__name__}: {error}")
            return
        ZooNameLister.cache[self.prefix] = names
        self.listed.emit(self.prefix, names, "")


class ModelDialog(QDialog):
    """A searchable list of model names: torchvision's classification models, and on
    request transformers' model types (``hf:gpt2``) and timm's models (``timm:resnet18``).
    Typing ``hf:`` or ``timm:`` switches the list; a name typed in full (``hf:./folder``)
    opens even when it is not listed."""

    def __init__(self, parent: QWidget | None, names: list[str]) -> None:
        super().__init__(parent)
        self.setWindowTitle("Open model by name")
        layout = QVBoxLayout(self)
        self.library = QComboBox()
        for label, prefix in LIBRARIES:
            self.library.addItem(label, prefix)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search models (e.g. resnet, vit; hf:gpt2, timm:resnet18)")
        self.search.setClearButtonEnabled(True)
        self.list = QListWidget()
        self._names: dict[str, list[str]] = {"": list(names), **ZooNameLister.cache}
        self._listers: dict[str, ZooNameLister] = {}
        self._messages: dict[str, str] = {}
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setStyleSheet("color: #a05a00;")
        self.note = QLabel("")
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: #666;")
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(self.library)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.note)
        layout.addWidget(buttons)
        self.search.textChanged.connect(self._on_search_text_changed)
        self.library.currentIndexChanged.connect(self._on_library_current_index_changed)
        self.list.itemDoubleClicked.connect(lambda _item: self.accept())
        # Asked before a model over HUGE_MODEL_PARAMETERS is built (a name answered yes
        # to is not asked again); the estimate is made without building the model.
        self.estimate: Callable[[str], int | None] = _estimate
        self.size_question: QMessageBox | None = None
        self._confirmed: str | None = None
        self._show_library("")
        self.resize(420, 520)

    def accept(self) -> None:
        name = self.selected_name()
        if name is None or name == self._confirmed:
            super().accept()
            return
        from gradscope.core.model_size import HUGE_MODEL_PARAMETERS, is_huge

        count = self.estimate(name)
        if not is_huge(count):
            super().accept()
            return
        assert count is not None
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "A large model",
            f"{name} has about {count / 1e6:,.0f} million parameters (more than "
            f"{HUGE_MODEL_PARAMETERS / 1e6:,.0f} million).\n\n"
            "Building it with random weights takes a while, its weights and gradients "
            f"alone take about {count * 8 / 1e9:.1f} GB of memory (float32), and a step on "
            "a CPU can take minutes.\n\nBuild it anyway?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            self,
        )
        box.setDefaultButton(QMessageBox.StandardButton.No)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.finished.connect(lambda _result: self._on_size_question_finished(name, box))
        self.size_question = box
        box.open()

    def _on_size_question_finished(self, name: str, box: QMessageBox) -> None:
        self.size_question = None
        if box.clickedButton() is box.button(QMessageBox.StandardButton.Yes):
            self._confirmed = name
            super().accept()
        else:  # back to the list, to pick another
            self.search.setFocus(Qt.FocusReason.OtherFocusReason)

    def prefix(self) -> str:
        return str(self.library.currentData() or "")

    def _show_library(self, prefix: str) -> None:
        self.note.setText(
            {
                "": "Built with random weights (nothing is downloaded); the input size comes from "
                "the run settings or the model's requirement.",
                "hf:": "A randomly initialised model from transformers' default config for the "
                "type (offline); configs too big for a CPU are scaled down (see the model "
                "notes in Run settings). hf:<folder> takes a folder with a config.json.",
                "timm:": "timm's create_model(name, pretrained=False): random weights, at the "
                "model's own input size.",
            }[prefix]
        )
        self.list.clear()
        names = self._names.get(prefix)
        if names is None:
            self.status.setText(self._messages.get(prefix) or f"listing {prefix[:-1]} models…")
            if prefix not in self._listers and prefix not in self._messages:
                lister = ZooNameLister(prefix, self)
                lister.listed.connect(self._on_lister_listed)
                self._listers[prefix] = lister
                lister.start()
            return
        self.status.setText("")
        self.list.addItems(names)
        self._on_search_text_changed(self.search.text())

    def _on_library_current_index_changed(self, _index: int) -> None:
        prefix = self.prefix()
        typed = self.search.text().strip().lower()
        if typed.startswith(("hf:", "timm:")) and not (prefix and typed.startswith(prefix)):
            # Another library's name typed: it would switch the list straight back.
            self.search.blockSignals(True)
            self.search.clear()
            self.search.blockSignals(False)
        self._show_library(prefix)

    def _on_lister_listed(self, prefix: str, names: list[str], message: str) -> None:
        if message:
            self._messages[prefix] = message
        else:
            self._names[prefix] = names
        if prefix == self.prefix():
            self._show_library(prefix)

    def wait_for_listers(self, timeout_ms: int = 60_000) -> None:
        for lister in self._listers.values():
            lister.wait(timeout_ms)

    def done(self, result: int) -> None:
        # A lister still importing its library finishes on its own; it must not outlive
        # the dialog's C++ object while running.
        for lister in self._listers.values():
            if lister.isRunning():
                lister.setParent(None)
                lister.finished.connect(lister.deleteLater)
                _orphans.add(lister)
                lister.finished.connect(lambda lister=lister: _orphans.discard(lister))
        super().done(result)

    def _on_search_text_changed(self, text: str) -> None:
        needle = text.strip().lower()
        for prefix in ("hf:", "timm:"):
            if needle.startswith(prefix) and self.prefix() != prefix:
                self.library.setCurrentIndex(self.library.findData(prefix))
                return
        first = exact = None
        for row in range(self.list.count()):
            item = self.list.item(row)
            name = item.text().lower()
            hidden = needle not in name
            item.setHidden(hidden)
            if not hidden and first is None:
                first = row
            if exact is None and needle and name in (needle, self.prefix() + needle):
                exact = row
        # Enter takes the name typed in full, or else the first one that matches; with
        # nothing typed nothing is chosen (the first of a list can be a billion-parameter
        # model).
        chosen = exact if exact is not None else first if needle else None
        if chosen is None:
            self.list.setCurrentRow(-1)
        else:
            self.list.setCurrentRow(chosen)

    def showEvent(self, event: object) -> None:
        super().showEvent(event)
        # Typing goes to the search (it went to the library box, and Enter opened the first
        # torchvision model whatever was typed).
        self.search.setFocus(Qt.FocusReason.OtherFocusReason)

    def selected_name(self) -> str | None:
        item = self.list.currentItem()
        if item is not None and not item.isHidden():
            return item.text()
        typed = self.search.text().strip()
        # A name the list does not hold, typed in full: a local HF folder, a timm name.
        if typed.startswith(("hf:", "timm:")) and len(typed.split(":", 1)[1]) > 0:
            return typed
        return None


def _estimate(name: str) -> int | None:
    from gradscope.core.errors import GradScopeError
    from gradscope.core.model_size import estimated_parameters

    try:
        return estimated_parameters(name)
    except GradScopeError:  # the library is missing: loading it will say so
        return None


_orphans: set[ZooNameLister] = set()
# The old name, for code that still uses it.
TorchvisionDialog = ModelDialog


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
    box.setText(
        "<b>GradScope</b>: see where a PyTorch run's gradients explode, vanish or "
        "turn NaN/Inf.<br><br>" + versions_text()
    )
    box.setIcon(QMessageBox.Icon.Information)
    box.open()
    return box
