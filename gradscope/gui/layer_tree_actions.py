"""What a big model's tree needs beyond ticking rows one by one: "Tick all matching" the
filter, and a right-click menu on a row (watch only this subtree, copy its name, export
its series as CSV). Handed the widgets and the export it uses, not the window."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QPoint, Qt
from PySide6.QtWidgets import QApplication, QLineEdit, QMenu, QPushButton, QTreeView

from gradscope.gui.module_tree_model import ModuleFilterModel, ModuleTreeModel


class LayerTreeActions(QObject):
    def __init__(
        self,
        parent: QObject,
        tree_view: QTreeView,
        tree_model: ModuleTreeModel,
        tree_proxy: ModuleFilterModel,
        filter_edit: QLineEdit,
        export_layer: Callable[[str], None],
    ) -> None:
        super().__init__(parent)
        self._view = tree_view
        self._model = tree_model
        self._proxy = tree_proxy
        self._filter = filter_edit
        self._export_layer = export_layer
        self.tick_matching_button = QPushButton("Tick all matching")
        self.tick_matching_button.setToolTip(
            "Watch every module whose name or type matches the filter (with its subtree)"
        )
        self.tick_matching_button.setEnabled(False)
        self.tick_matching_button.clicked.connect(self.tick_all_matching)
        filter_edit.textChanged.connect(self._on_filter_text_changed)
        tree_view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        tree_view.customContextMenuRequested.connect(self._on_tree_view_context_menu_requested)
        self.menu: QMenu | None = None

    def _on_filter_text_changed(self, text: str) -> None:
        self.tick_matching_button.setEnabled(bool(self._model.matching_modules(text)))

    def tick_all_matching(self) -> None:
        self._model.edit_watched(self._model.matching_modules(self._filter.text()))

    def menu_for(self, name: str) -> QMenu:
        """The right-click menu of the row of module ``name``."""
        menu = QMenu(self._view)
        shown = name or "(model)"
        menu.addAction(
            f"Watch only {shown} and below", lambda: self._model.edit_watched([name], only=True)
        )
        menu.addAction("Copy name", lambda: QApplication.clipboard().setText(name))
        menu.addAction(f"Export {shown}'s series as CSV…", lambda: self._export_layer(name))
        return menu

    def popup_for(self, name: str, global_position: QPoint) -> None:
        """The same menu for a layer's curve (a right-click on the gradient-norm plot)."""
        self.menu = self.menu_for(name)
        self.menu.popup(global_position)

    def _on_tree_view_context_menu_requested(self, position: QPoint) -> None:
        index = self._view.indexAt(position)
        if not index.isValid():
            return
        node = self._model.node(self._proxy.mapToSource(index))
        if node is None:
            return
        self.menu = self.menu_for(node.name)
        self.menu.popup(self._view.viewport().mapToGlobal(position))
