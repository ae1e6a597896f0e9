"""What the plots with a hover readout share: the label goes when the mouse leaves the plot
or its drawing area (``self.hover``, a text item; ``self.hover_text``, what it shows)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QWidget


class HoverLabelPlot(QWidget):
    """A plot widget whose hover label never stays pointing at data that is gone (a load, a
    rewind) or at a spot the mouse has left. Subclasses set ``hover`` and ``hover_text`` and
    install this widget as the event filter of their drawing area's viewport."""

    def hide_hover(self) -> None:
        self.hover.setVisible(False)
        self.hover_text = ""

    def leaveEvent(self, event: object) -> None:
        super().leaveEvent(event)
        self.hide_hover()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        # The mouse left the plot's drawing area, say onto the statistic or scale box over
        # its corner (children of the plot: this widget's own leaveEvent does not come, and
        # the label stayed over the open box's list).
        if event.type() == QEvent.Type.Leave:
            self.hide_hover()
        return False
