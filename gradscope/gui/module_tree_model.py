"""A Qt item model over the engine's ModuleTree (not a copy in a QTreeWidget).

Rows are the model's modules; a checkbox on every module that owns parameters says whether
the engine watches it. Parents are tri-state: ticking one ticks every layer in its subtree.
Ticks made by the user are announced with ``watched_layers_edited``; what the engine really
watches comes back through :meth:`set_watched`, so the boxes always show the engine's truth.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from PySide6.QtCore import (
    QAbstractItemModel,
    QModelIndex,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QFont

from gradscope.core.facts import STATUS_NONFINITE, STATUS_OK, STATUS_VANISHING, EarlyWarning
from gradscope.core.module_tree import ModuleNode, ModuleTree
from gradscope.gui.status_style import (
    ORIGIN_COLOR,
    ORIGIN_TINT,
    STATUS_TINTS,
    WARNING_COLOR,
    WARNING_TINT,
    format_value,
    inside_icon,
    origin_icon,
    severity,
    status_color,
    status_icon,
    status_label,
    status_tooltip,
    warning_icon,
    warning_tooltip,
)

NAME, TYPE, PARAMS, GRAD_NORM, STATUS = range(5)
HEADERS = ("Module", "Type", "Params", "Grad norm", "Status")
NAME_ROLE = Qt.ItemDataRole.UserRole + 1
_NO_STATUS = -1
_Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()


def format_count(count: int) -> str:
    """A parameter count short enough for its column: 73,984, 148k, 11.69M."""
    if count < 100_000:
        return f"{count:,}"
    if count < 1_000_000:
        return f"{count / 1e3:.0f}k"
    return f"{count / 1e6:.2f}M"


class ModuleTreeModel(QAbstractItemModel):
    watched_layers_edited = Signal(list)  # the layer names the user now wants watched

    def __init__(self, parent: object | None = None) -> None:
        super().__init__(parent)
        self._tree: ModuleTree | None = None
        self._nodes: list[ModuleNode] = []
        self._id: dict[int, int] = {}  # id(node) -> position in _nodes
        self._row: list[int] = []
        self._layers_under: list[list[int]] = []  # checkable nodes in each subtree
        self._watched: set[str] = set()
        self._norm: dict[str, float] = {}
        self._tiny_reasons: dict[str, str] = {}
        self._status: dict[str, int] = {}
        self._inside: list[int] = []  # worst status strictly inside each node's subtree
        # Early warnings up to the step on show, by module, oldest first; and whether a
        # module strictly inside each node has one.
        self._warnings: dict[str, list[EarlyWarning]] = {}
        self._warned_inside: list[bool] = []
        self._origin: str | None = None
        self._origin_text = ""
        self._origin_kind = "NaN"
        self._answers: dict[tuple[int, int, int], object] = {}  # see data()

    # -- feeding -----------------------------------------------------------------------
    def set_tree(self, tree: ModuleTree | None, watched: Iterable[str] = ()) -> None:
        self.beginResetModel()
        self._tree = tree
        self._nodes = list(tree) if tree is not None else []
        self._id = {id(node): i for i, node in enumerate(self._nodes)}
        self._row = [0] * len(self._nodes)
        for node in self._nodes:
            for row, child in enumerate(node.children):
                self._row[self._id[id(child)]] = row
        self._layers_under = [[] for _ in self._nodes]
        for i in reversed(range(len(self._nodes))):
            node = self._nodes[i]
            under = [i] if node.own_params > 0 else []
            for child in node.children:
                under.extend(self._layers_under[self._id[id(child)]])
            self._layers_under[i] = under
        self._watched = self._expand(watched)
        self._norm, self._status = {}, {}
        self._inside = [_NO_STATUS] * len(self._nodes)
        self._warnings, self._warned_inside = {}, [False] * len(self._nodes)
        self._origin, self._origin_text = None, ""
        self._answers.clear()
        self.endResetModel()

    @property
    def tree(self) -> ModuleTree | None:
        return self._tree

    def _expand(self, names: Iterable[str]) -> set[str]:
        """Watched names as checkable rows: a watched container (no own parameters) stands
        for every parameterised module under it."""
        result: set[str] = set()
        for name in names:
            node = self._tree.nodes.get(name) if self._tree is not None else None
            if node is None:
                continue
            result.update(self._nodes[i].name for i in self._layers_under[self._id[id(node)]])
        return result

    def set_watched(self, names: Iterable[str]) -> None:
        """What the engine watches now (the reverse direction of the checkboxes)."""
        watched = self._expand(names)
        if watched != self._watched:
            self._watched = watched
            self._changed_everywhere(NAME, NAME)

    def edit_watched(self, names: Iterable[str], only: bool = False) -> None:
        """The user's edit of many rows at once: watch ``names`` (their subtrees) too, or
        with ``only`` nothing else; told as one ``watched_layers_edited``."""
        expanded = self._expand(names)
        watched = expanded if only else self._watched | expanded
        if watched != self._watched:
            self._watched = watched
            self._changed_everywhere(NAME, NAME)
            self.watched_layers_edited.emit(self.watched_layers())

    def matching_modules(self, text: str) -> list[str]:
        """Modules whose name or type holds ``text`` (the filter box's rule)."""
        needle = text.strip().lower()
        if not needle:
            return []
        return [
            n.name for n in self._nodes if needle in n.name.lower() or needle in n.type_name.lower()
        ]

    def watched_layers(self) -> list[str]:
        """Checked layers in the tree's (forward registration) order."""
        return [n.name for n in self._nodes if n.own_params > 0 and n.name in self._watched]

    def set_step_values(
        self,
        norms: dict[str, float],
        statuses: dict[str, int],
        tiny_reasons: dict[str, str] | None = None,
        warnings: Iterable[EarlyWarning] = (),
    ) -> None:
        """Gradient norm and status per layer at the step on show, as the engine measured,
        why a layer's gradient is tiny where the engine saw it, and the early warnings of
        the run up to that step (a warning stays: the drift it saw has not gone away)."""
        self._norm, self._status = norms, statuses
        self._tiny_reasons = dict(tiny_reasons or {})
        self._warnings = {}
        for warning in warnings:
            if warning.module is not None:
                self._warnings.setdefault(warning.module, []).append(warning)
        inside = [_NO_STATUS] * len(self._nodes)
        warned_inside = [False] * len(self._nodes)
        for i in reversed(range(len(self._nodes))):
            worst = _NO_STATUS
            warned = False
            for child in self._nodes[i].children:
                c = self._id[id(child)]
                worst = max(worst, inside[c], statuses.get(child.name, _NO_STATUS), key=severity)
                warned = warned or warned_inside[c] or child.name in self._warnings
            inside[i] = worst
            warned_inside[i] = warned
        self._inside = inside
        self._warned_inside = warned_inside
        self._changed_everywhere(NAME, STATUS)

    def set_origin(self, module: str | None, description: str = "", kind: str = "nan") -> None:
        """Mark the module where the first NaN/Inf was made (``kind``: "nan" or "inf")."""
        self._origin, self._origin_text = module, description
        self._origin_kind = "Inf" if kind == "inf" else "NaN"
        self._changed_everywhere(NAME, STATUS)

    @property
    def origin(self) -> str | None:
        return self._origin

    def _changed_everywhere(self, first: int, last: int) -> None:
        self._answers.clear()
        for i, node in enumerate(self._nodes):
            if node.children:
                parent = self.createIndex(self._row[i], 0, i)
                self.dataChanged.emit(
                    self.index(0, first, parent), self.index(len(node.children) - 1, last, parent)
                )
        if self._nodes:
            self.dataChanged.emit(self.index(0, first), self.index(0, last))

    # -- lookup ------------------------------------------------------------------------
    def index_of(self, name: str, column: int = 0) -> QModelIndex:
        node = self._tree.nodes.get(name) if self._tree is not None else None
        if node is None:
            return QModelIndex()
        i = self._id[id(node)]
        return self.createIndex(self._row[i], column, i)

    def node(self, index: _Index) -> ModuleNode | None:
        if not index.isValid():
            return None
        return self._nodes[index.internalId()]

    # -- QAbstractItemModel ------------------------------------------------------------
    def index(self, row: int, column: int, parent: _Index = _ROOT) -> QModelIndex:
        # hasIndex's checks, without its two calls back into Python (rowCount and
        # columnCount): a repaint of the tree asks for an index about 900 times (the
        # filter proxy maps each cell it shows back to this model).
        if row < 0 or not 0 <= column < len(HEADERS) or not self._nodes:
            return QModelIndex()
        if not parent.isValid():
            return self.createIndex(row, column, 0) if row == 0 else QModelIndex()
        if parent.column() != 0:
            return QModelIndex()
        children = self._nodes[parent.internalId()].children
        if row >= len(children):
            return QModelIndex()
        return self.createIndex(row, column, self._id[id(children[row])])

    def parent(self, index: _Index = _ROOT) -> QModelIndex:  # type: ignore[override]
        if not index.isValid():
            return QModelIndex()
        node = self._nodes[index.internalId()]
        if node.parent is None:
            return QModelIndex()
        i = self._id[id(node.parent)]
        return self.createIndex(self._row[i], 0, i)

    def rowCount(self, parent: _Index = _ROOT) -> int:
        if not self._nodes:
            return 0
        if not parent.isValid():
            return 1
        if parent.column() != 0:
            return 0
        return len(self._nodes[parent.internalId()].children)

    def columnCount(self, parent: _Index = _ROOT) -> int:
        return len(HEADERS)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> object:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return HEADERS[section]
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if index.column() == NAME and self._layers_under[index.internalId()]:
            flags |= Qt.ItemFlag.ItemIsUserCheckable
        return flags

    def _check_state(self, i: int) -> Qt.CheckState | None:
        layers = self._layers_under[i]
        if not layers:
            return None
        ticked = sum(self._nodes[j].name in self._watched for j in layers)
        if ticked == 0:
            return Qt.CheckState.Unchecked
        if ticked == len(layers):
            return Qt.CheckState.Checked
        return Qt.CheckState.PartiallyChecked

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        # A repaint asks each visible cell for seven roles: answers are kept until the
        # model changes (every change goes through _changed_everywhere or a reset).
        key = (index.internalId(), index.column(), role)
        try:
            return self._answers[key]
        except KeyError:
            pass
        value = self._answers[key] = self._data(index, role)
        return value

    def _data(self, index: _Index, role: int) -> object:
        i = index.internalId()
        node = self._nodes[i]
        column = index.column()
        own = self._status.get(node.name, _NO_STATUS)
        is_origin = self._origin is not None and node.name == self._origin
        # A warning shows where no gradient status is worse than ok: a layer exploding or
        # NaN/Inf already says more than its precursor did.
        warned = own <= STATUS_OK and node.name in self._warnings
        warned_inside = (
            not warned
            and own <= STATUS_OK
            and self._inside[i] <= STATUS_OK
            and self._warned_inside[i]
        )
        if role == Qt.ItemDataRole.DisplayRole:
            if column == STATUS and not is_origin and (warned or warned_inside):
                # The latest warning's kind; "ok" would hide it.
                return self._warnings[node.name][-1].kind if warned else "warning inside"
            return self._display(node, column, own, is_origin)
        if role == Qt.ItemDataRole.CheckStateRole and column == NAME:
            return self._check_state(i)
        if role == Qt.ItemDataRole.DecorationRole and column == NAME:
            if is_origin:
                return origin_icon()
            if own > STATUS_OK:
                return status_icon(own)
            if warned:
                return warning_icon()
            if self._inside[i] > STATUS_OK:
                return inside_icon(self._inside[i])
            return None
        if role == Qt.ItemDataRole.BackgroundRole:
            if is_origin:
                return QBrush(QColor(ORIGIN_TINT))
            if own in STATUS_TINTS:
                return QBrush(QColor(STATUS_TINTS[own]))
            if warned:
                return QBrush(QColor(WARNING_TINT))
            return None
        if role == Qt.ItemDataRole.ForegroundRole:
            if is_origin:
                return QBrush(QColor(ORIGIN_COLOR))
            if column == STATUS:
                status = own if own > STATUS_OK else self._inside[i]
                if status > STATUS_OK:
                    return QBrush(status_color(status).darker(120))
                if warned or warned_inside:
                    return QBrush(QColor(WARNING_COLOR).darker(130))
            return None
        if role == Qt.ItemDataRole.FontRole:
            if is_origin or (column == STATUS and (own > STATUS_OK or warned)):
                font = QFont()
                font.setBold(True)
                return font
            if column == STATUS and (self._inside[i] > STATUS_OK or warned_inside):
                font = QFont()
                font.setItalic(True)
                return font
            return None
        if role == Qt.ItemDataRole.TextAlignmentRole and column in (PARAMS, GRAD_NORM):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(node, own, is_origin, i)
        if role == NAME_ROLE:
            return node.name
        return None

    def _display(self, node: ModuleNode, column: int, own: int, is_origin: bool) -> str:
        if column == NAME:
            return node.short_name
        if column == TYPE:
            return node.type_name
        if column == PARAMS:
            return format_count(node.total_params) if node.total_params else ""
        if column == GRAD_NORM:
            value = self._norm.get(node.name)
            return format_value(value) if value is not None else ""
        if column == STATUS:
            if is_origin:
                return f"{self._origin_kind} origin"
            if own != _NO_STATUS:
                return status_label(own)
            inside = self._inside[self._id[id(node)]]
            if inside > STATUS_OK:
                return status_label(inside)  # italic: somewhere inside this module
        return ""

    def _tooltip(self, node: ModuleNode, own: int, is_origin: bool, i: int) -> str:
        lines = [f"{node.name or '(model root)'}  ({node.type_name})"]
        if node.total_params:
            lines.append(f"{node.total_params:,} parameters ({node.own_params:,} own)")
        if own != _NO_STATUS:
            value = self._norm.get(node.name, math.nan)
            why = self._tiny_reasons.get(node.name) if own == STATUS_VANISHING else None
            lines.append(f"gradient norm {format_value(value)}: {status_tooltip(own, why)}")
        elif self._inside[i] > STATUS_OK:
            lines.append(f"a layer inside is {status_label(self._inside[i])}")
        if is_origin:
            lines.append(f"first non-finite value made here: {self._origin_text}")
        lines.extend(warning_tooltip(warning) for warning in self._warnings.get(node.name, ()))
        if self._warned_inside[i]:
            lines.append("a layer inside has an early warning")
        return "\n".join(lines)

    def setData(self, index: _Index, value: object, role: int = Qt.ItemDataRole.EditRole) -> bool:
        if role != Qt.ItemDataRole.CheckStateRole or not index.isValid():
            return False
        i = index.internalId()
        layers = self._layers_under[i]
        if not layers:
            return False
        state = value if isinstance(value, Qt.CheckState) else Qt.CheckState(int(value))
        names = {self._nodes[j].name for j in layers}
        if state == Qt.CheckState.Unchecked:
            self._watched -= names
        else:
            self._watched |= names
        self._changed_everywhere(NAME, NAME)
        self.watched_layers_edited.emit(self.watched_layers())
        return True

    def worst_status(self) -> int:
        return max(self._status.values(), default=_NO_STATUS)

    def warned_layers(self) -> list[str]:
        """Layers with an early warning up to the step on show."""
        return list(self._warnings)

    def flagged_layers(self) -> list[str]:
        return [name for name, s in self._status.items() if s == STATUS_NONFINITE]


class ModuleFilterModel(QSortFilterProxyModel):
    """Filters by module name (dotted path) or type; ancestors of a match stay visible."""

    def __init__(self, parent: object | None = None) -> None:
        super().__init__(parent)
        self.setRecursiveFilteringEnabled(True)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        # Rows are filtered by name and type, which never change: without this, every
        # dataChanged (new gradient norms, each refresh) re-runs the filter on each row.
        self.setDynamicSortFilter(False)
        self._text = ""

    def set_filter_text(self, text: str) -> None:
        if hasattr(self, "beginFilterChange"):  # Qt >= 6.9; invalidateFilter is deprecated
            self.beginFilterChange()
            self._text = text.strip().lower()
            self.endFilterChange()
        else:
            self._text = text.strip().lower()
            self.invalidateFilter()

    def filterAcceptsRow(self, source_row: int, source_parent: _Index) -> bool:
        if not self._text:
            return True
        model = self.sourceModel()
        index = model.index(source_row, 0, source_parent)
        node = model.node(index)
        if node is None:
            return False
        return self._text in node.name.lower() or self._text in node.type_name.lower()
