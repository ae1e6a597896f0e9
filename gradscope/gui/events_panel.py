"""The events list: exploding/vanishing onsets, early warnings (with their evidence and hint)
and the first NaN/Inf origin, as the engine's RunHistory recorded them. Clicking one selects
its layer and step everywhere."""

from __future__ import annotations

import dataclasses
import html
import os
from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QScrollArea,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gradscope.core.facts import EarlyWarning, Origin
from gradscope.core.history import Event
from gradscope.core.watch import STATUS_EXPLODING, STATUS_NONFINITE, STATUS_VANISHING
from gradscope.gui.selection import Selection
from gradscope.gui.status_style import (
    ORIGIN_TINT,
    WARNING_TINT,
    origin_icon,
    status_icon,
    warning_icon,
    warning_tooltip,
)

_KIND_STATUS = {
    "exploding": STATUS_EXPLODING,
    "vanishing": STATUS_VANISHING,
    "nonfinite": STATUS_NONFINITE,
}
_KIND_LABEL = {
    "nonfinite": "NaN/Inf",
    "origin": "NaN/Inf origin",
    "scale collapse": "Loss scale collapse",
    "settings": "settings changed",
    "rewind": "rewound",
}
_LAYER_ROLE = Qt.ItemDataRole.UserRole + 1
_STEP_ROLE = Qt.ItemDataRole.UserRole + 2
_WARNING_ROLE = Qt.ItemDataRole.UserRole + 3


def _value_lines(origin: Origin) -> list[str]:
    """The engine's lines about the values at the origin (inputs, outputs, gradients)."""
    try:
        from gradscope.core.diagnosis import explain
    except ImportError:  # an engine without the diagnosis module
        return []
    return [line.strip() for line in explain(origin) if line.startswith("  ")]


def scale_collapse(origin: Origin | None) -> float | None:
    """The loss scale a collapse ended at, when this origin is a scale collapse's (the
    engine puts it in ``details["scale_collapse"]``)."""
    details = origin.details if origin is not None and isinstance(origin.details, dict) else {}
    value = details.get("scale_collapse")
    return float(value) if isinstance(value, (int, float)) else None


def collapse_words(scale: float) -> str:
    return f"loss scale collapsed to {scale:g}"


def origin_html(origin: Origin) -> str:
    """The origin's fields for the banner above the list."""
    # ("module none: in the batch" read as a module named none.)
    if origin.phase == "input":
        where = "in the batch (your data), not in the model or the loss"
    elif (origin.details.get("evidence") or {}).get("default_loss"):
        where = "in GradScope's default loss (your script has no loss_fn)"
    elif origin.module is None:
        where = "outside the model (loss code)"
    else:
        where = f"module <b>{origin.module or '(model root)'}</b>"
    parts = []
    collapse = scale_collapse(origin)
    if collapse is not None:
        # A collapse is why the run stopped; the NaN/Inf origin below says where it came from.
        parts.append(
            f"<span style='color:#b00000;font-weight:bold'>Step {origin.step}: "
            f"{collapse_words(collapse)}</span> (the scaler skips every step now)"
        )
    parts += [
        f"<span style='color:#b00000;font-weight:bold'>First {origin.kind.upper()} at step "
        f"{origin.step}</span> in the {origin.phase} pass",
        f"{where}, tensor <b>{origin.tensor}</b>",
    ]
    if origin.op:
        parts.append(f"operation <code>{origin.op}</code>")
    if origin.file:
        code = f": <code>{html.escape(origin.code.strip())}</code>" if origin.code else ""
        parts.append(f"{os.path.basename(origin.file)}:{origin.line}{code}")
    for line in _value_lines(origin):
        parts.append(f"<code>{html.escape(line)}</code>")
    hint = origin.details.get("hint") if isinstance(origin.details, dict) else None
    if hint:
        parts.append(f"<i>{html.escape(hint)}</i>")
    return "<br>".join(parts)


class EventsPanel(QWidget):
    selection_made = Signal(object)  # Selection
    # A click on an early warning's row (after its selection_made): the plots show its
    # quantity.
    warning_chosen = Signal(object)  # EarlyWarning

    def __init__(self) -> None:
        super().__init__()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.banner = QLabel()
        self.banner.setWordWrap(True)
        self.banner.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.banner.setTextFormat(Qt.TextFormat.RichText)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner.setStyleSheet(
            "QLabel { background: #fdeeee; border: 1px solid #e3a0a0; "
            "border-radius: 3px; padding: 4px; }"
        )
        # In a scroll area of bounded height, so a long diagnosis never hides the list.
        self.banner_area = QScrollArea()
        self.banner_area.setWidget(self.banner)
        self.banner_area.setWidgetResizable(True)
        self.banner_area.setFrameShape(QScrollArea.Shape.NoFrame)
        self.banner_area.setMaximumHeight(190)
        self.banner_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.banner_area.setVisible(False)
        layout.addWidget(self.banner_area)
        # A distributed run's recordings: each rank's steps and which rank broke first.
        self.rank_note = QLabel()
        self.rank_note.setWordWrap(True)
        self.rank_note.setTextFormat(Qt.TextFormat.RichText)
        self.rank_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.rank_note.setStyleSheet(
            "padding: 4px; background: #eef2f8; border: 1px solid #c8d2e0;"
        )
        self.rank_note.setVisible(False)
        layout.insertWidget(layout.indexOf(self.banner_area), self.rank_note)
        # The compared runs' own first NaN/Inf (each a link to its layer and step): a run
        # compared here is judged by where it broke too, not only the shown run.
        self.compared_note = QLabel()
        self.compared_note.setWordWrap(True)
        self.compared_note.setTextFormat(Qt.TextFormat.RichText)
        self.compared_note.setStyleSheet(
            "padding: 4px; background: #fbf3f3; border: 1px dashed #e3a0a0;"
        )
        self.compared_note.setVisible(False)
        self.compared_note.linkActivated.connect(self._on_compared_note_link_activated)
        layout.insertWidget(layout.indexOf(self.banner_area) + 1, self.compared_note)
        self._compared_origins: list[tuple[str, Origin]] = []
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["Step", "Event", "Layer", "Details"])
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)
        self.table.setAlternatingRowColors(True)
        header = self.table.horizontalHeader()
        for column in range(3):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.placeholder = QLabel(
            "No events yet: onsets of exploding or vanishing gradients, early warnings "
            "and the first NaN/Inf will be listed here."
        )
        self.placeholder.setWordWrap(True)
        self.placeholder.setStyleSheet("color: #777; padding: 6px;")
        layout.addWidget(self.placeholder)
        layout.addWidget(self.table, 1)
        self.table.cellClicked.connect(self._on_table_cell_clicked)
        self.table.cellActivated.connect(self._on_table_cell_clicked)
        self._shown = 0
        self._banner_shown = False

    def resizeEvent(self, event: object) -> None:
        # The banner takes at most a third of the panel: in a short dock (1280x800) a fixed
        # 190 px left the list 1.5 rows.
        super().resizeEvent(event)
        self.banner_area.setMaximumHeight(max(60, min(190, self.height() // 3)))

    def set_rank_note(self, text: str) -> None:
        self.rank_note.setText(text)
        self.rank_note.setVisible(bool(text))

    def set_compared_origins(self, origins: list[tuple[str, Origin]]) -> None:
        """Each compared run's first NaN/Inf origin, as (run name, origin)."""
        if origins == self._compared_origins:
            return
        self._compared_origins = list(origins)
        lines = []
        for index, (name, origin) in enumerate(origins):
            where = (
                "in the batch"
                if origin.phase == "input"
                else "outside the model"
                if origin.module is None
                else f"in {origin.module or '(model root)'}"
            )
            lines.append(
                f"<b>{html.escape(name)}</b> (compared): "
                f"<a href='{index}'>first {origin.kind.upper()} at step {origin.step}, "
                f"{html.escape(where)}</a> in the {origin.phase} pass"
            )
        self.compared_note.setText("<br>".join(lines))
        self.compared_note.setToolTip(
            "<br><br>".join(f"<b>{html.escape(n)}</b><br>{origin_html(o)}" for n, o in origins)
        )
        self.compared_note.setVisible(bool(origins))

    def _on_compared_note_link_activated(self, link: str) -> None:
        _, origin = self._compared_origins[int(link)]
        self.selection_made.emit(Selection(origin.module, origin.step))

    def clear(self) -> None:
        self.table.setRowCount(0)
        self._shown = 0
        self._banner_shown = False
        self.banner_area.setVisible(False)
        self.placeholder.setVisible(True)

    def update_events(
        self,
        events: list[Event],
        origin: Origin | None,
        warnings: Sequence[EarlyWarning] = (),
    ) -> None:
        """Add the events not shown yet; the origin goes to the top and the banner. A
        history that lost events (a rewound run) is shown afresh. ``warnings``: the run's
        early warnings (RunHistory.warnings), whose "warning" events are shown with their
        kind, evidence and hint."""
        if len(events) < self._shown or (origin is None and self._banner_shown):
            self.clear()
        if origin is not None and not self._banner_shown:
            self.banner.setText(origin_html(origin))
            self.banner_area.setVisible(True)
            self._banner_shown = True
        new = events[self._shown :]
        if not new:
            return
        self.placeholder.setVisible(False)
        collapse = scale_collapse(origin)
        by_event = {(w.step, w.module, w.describe()): w for w in warnings}
        for event in new:
            row = 0 if event.kind == "origin" else self.table.rowCount()
            self.table.insertRow(row)
            if (
                collapse is not None
                and origin is not None
                and event.kind == "origin"
                and event.step == origin.step
            ):
                event = dataclasses.replace(
                    event,
                    kind="scale collapse",
                    message=f"{collapse_words(collapse)}; {event.message}",
                )
            warning = (
                by_event.get((event.step, event.layer, event.message))
                if event.kind == "warning"
                else None
            )
            self._fill_row(row, event, warning)
        self._shown = len(events)

    def _fill_row(self, row: int, event: Event, warning: EarlyWarning | None = None) -> None:
        step = QTableWidgetItem(str(event.step))
        step.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        kind = QTableWidgetItem(_KIND_LABEL.get(event.kind, event.kind))
        if event.kind in ("origin", "scale collapse"):
            kind.setIcon(origin_icon())
        elif event.kind in _KIND_STATUS:
            kind.setIcon(status_icon(_KIND_STATUS[event.kind]))
        elif event.kind == "warning":
            kind.setIcon(warning_icon())
        layer = QTableWidgetItem(
            "(outside the model)" if event.layer is None else event.layer or "(model)"
        )
        details = QTableWidgetItem(event.message)
        details.setToolTip(event.message)
        if warning is not None:
            # A whole-model quantity (the loss) has no layer: not "outside the model".
            kind.setText(warning.kind)
            if warning.module is None:
                layer.setText("(whole model)")
            text = warning.evidence + (f" ▸ {warning.hint}" if warning.hint else "")
            details.setText(text)
            for item in (kind, details):
                item.setToolTip(warning_tooltip(warning))
        items = (step, kind, layer, details)
        for column, item in enumerate(items):
            item.setData(_LAYER_ROLE, event.layer)
            item.setData(_STEP_ROLE, event.step)
            item.setData(_WARNING_ROLE, warning)
            if event.kind in ("origin", "scale collapse"):
                font = QFont()
                font.setBold(True)
                item.setFont(font)
                item.setBackground(QBrush(QColor(ORIGIN_TINT)))
            elif warning is not None:
                item.setBackground(QBrush(QColor(WARNING_TINT)))
            self.table.setItem(row, column, item)

    def row_count(self) -> int:
        return self.table.rowCount()

    def _on_table_cell_clicked(self, row: int, column: int) -> None:
        item = self.table.item(row, column)
        if item is None:
            return
        self.selection_made.emit(Selection(item.data(_LAYER_ROLE), item.data(_STEP_ROLE)))
        warning = item.data(_WARNING_ROLE)
        if isinstance(warning, EarlyWarning):
            self.warning_chosen.emit(warning)
