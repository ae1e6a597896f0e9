"""A distributed run's recordings in the app (``gradscope open runs/x.rank1.gsrec``, or the
common name ``runs/x.gsrec``): a rank selector in the toolbar that switches the rank shown,
every rank's loss on the loss plot, and which rank went non-finite first above the events.
The engine reads the set and says which rank broke (gradscope/core/recording/rank_set.py,
gradscope/core/rank_facts.py); this only shows it."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QComboBox, QLabel, QToolBar

from gradscope.core.rank_facts import first_nonfinite_rank, rank_lines

if TYPE_CHECKING:
    from gradscope.core.recording.rank_set import LoadedSet
    from gradscope.gui.events_panel import EventsPanel

# Ranks' loss curves: distinct from the shown rank's black curve and the status red.
_RANK_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def rank_color(rank: int) -> str:
    return _RANK_COLORS[rank % len(_RANK_COLORS)]


class RankSetView(QObject):
    """Given the widgets it adds to and writes into (the toolbar, the loss plot, the events
    panel), not the window: it needs nothing of the window's module."""

    rank_chosen = Signal(int)

    def __init__(
        self,
        parent: QObject,
        toolbar: QToolBar,
        loss_item: pg.PlotItem,
        events_panel: EventsPanel,
    ) -> None:
        super().__init__(parent)
        self._loss_item = loss_item
        self._events_panel = events_panel
        self.loaded: LoadedSet | None = None
        self.shown_rank: int | None = None
        self.label = QLabel("Rank:")
        self.label.setStyleSheet("padding: 0 4px 0 8px;")
        self.combo = QComboBox()
        self.combo.setToolTip(
            "Each rank of the distributed run wrote its own recording: choose the one to show"
        )
        self.combo.setMinimumContentsLength(18)
        self._label_action = toolbar.addWidget(self.label)
        self._combo_action = toolbar.addWidget(self.combo)
        self._set_visible(False)
        self.combo.activated.connect(self._on_combo_activated)
        self.legend = pg.LegendItem(offset=(-10, 10), labelTextSize="8pt", verSpacing=-6)
        self.legend.setParentItem(loss_item.vb)
        self.legend.setVisible(False)
        self.curves: dict[int, pg.PlotDataItem] = {}

    def _set_visible(self, visible: bool) -> None:
        self._label_action.setVisible(visible)
        self._combo_action.setVisible(visible)

    def show_set(self, loaded: LoadedSet, rank: int) -> None:
        """Show ``loaded``'s ranks with ``rank``'s recording in the window."""
        self.loaded, self.shown_rank = loaded, rank
        facts = {f.rank: f for f in loaded.facts}
        broke = first_nonfinite_rank(loaded.facts)
        self.combo.blockSignals(True)
        self.combo.clear()
        for number in sorted(loaded.recordings.paths):
            text = f"rank {number}"
            first = facts[number].first_nonfinite if number in facts else None
            if number == broke and first is not None:
                text += f" (first non-finite, step {first[0]})"
            self.combo.addItem(text, number)
        self.combo.setCurrentIndex(max(0, self.combo.findData(rank)))
        self.combo.blockSignals(False)
        self._set_visible(True)
        self._draw_losses(loaded, rank)
        lines = rank_lines(loaded.facts) + list(loaded.recordings.notes)
        world = loaded.recordings.world_size
        head = f"Distributed run: {len(loaded.recordings.paths)} of {world or '?'} rank(s)"
        body = "<br>".join(
            f"<b style='color:#b00000'>{html.escape(line)}</b>"
            if line.startswith("first rank to go non-finite")
            else html.escape(line)
            for line in lines
        )
        self._events_panel.set_rank_note(f"<b>{head}</b>, showing rank {rank}<br>{body}")

    def _draw_losses(self, loaded: LoadedSet, shown: int) -> None:
        self.legend.clear()
        for curve in self.curves.values():
            curve.setData([])
            curve.setVisible(False)
        for facts in loaded.facts:
            curve = self.curves.get(facts.rank)
            if curve is None:
                curve = pg.PlotDataItem(connect="finite")
                self._loss_item.addItem(curve)
                self.curves[facts.rank] = curve
            losses = np.array([np.nan if v is None else v for v in facts.losses], dtype=float)
            width = 2.2 if facts.rank == shown else 1.2
            curve.setPen(pg.mkPen(rank_color(facts.rank), width=width))
            curve.setData(
                np.asarray(facts.steps, dtype=float),
                np.where(np.isfinite(losses), losses, np.nan),
                connect="finite",
            )
            curve.setZValue(-1)
            curve.setVisible(True)
            suffix = " (shown)" if facts.rank == shown else ""
            self.legend.addItem(curve, f"rank {facts.rank} loss{suffix}")
        self.legend.setVisible(bool(loaded.facts))

    def clear(self) -> None:
        self.loaded = self.shown_rank = None
        self._set_visible(False)
        self.legend.clear()
        self.legend.setVisible(False)
        for curve in self.curves.values():
            curve.setData([])
            curve.setVisible(False)
        self._events_panel.set_rank_note("")

    def _on_combo_activated(self, index: int) -> None:
        rank = self.combo.itemData(index)
        if rank is not None and rank != self.shown_rank:
            self.rank_chosen.emit(int(rank))
