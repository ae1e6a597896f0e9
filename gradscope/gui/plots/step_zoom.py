"""Zooming a plot against step as TensorBoard and W&B do: the wheel, a right-drag and a
rubber band (left-drag) change the step axis only, and the value axis keeps fitting the
data in view. (The wheel used to zoom y too, and the curves left the view.)"""

from __future__ import annotations

from collections.abc import Callable

import pyqtgraph as pg
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt
from PySide6.QtGui import QTransform


class StepZoomViewBox(pg.ViewBox):
    """A view box whose mouse zooms the step (x) axis only; with ``fit_values`` the value
    axis auto-ranges over what is in view."""

    def __init__(self, fit_values: bool = True, **options: object) -> None:
        super().__init__(**options)
        # Asked on a right-click: True when it showed a menu of its own for what is under
        # the mouse (a curve); otherwise pyqtgraph's menu (View All, Export...) shows.
        self.context_menu_at: Callable[[QPointF, QPoint], bool] | None = None
        self.setMouseEnabled(x=True, y=False)
        self.setMouseMode(pg.ViewBox.RectMode)
        if fit_values:
            self.setAutoVisible(y=True)
            self.enableAutoRange(axis=pg.ViewBox.YAxis)

    def mouseClickEvent(self, ev: object) -> None:
        if (
            ev.button() == Qt.MouseButton.RightButton
            and self.context_menu_at is not None
            and self.context_menu_at(ev.scenePos(), ev.screenPos().toPoint())
        ):
            ev.accept()
            return
        super().mouseClickEvent(ev)

    def showAxRect(self, ax: QRectF, **_options: object) -> None:
        """The rubber band's steps become the step range; the values are left to fit."""
        ax = ax.normalized()
        if ax.width() <= 0:
            return
        self.setXRange(ax.left(), ax.right(), padding=0)
        self.sigRangeChangedManually.emit(self.state["mouseEnabled"])

    def updateScaleBox(self, p1: QPointF, p2: QPointF) -> None:
        """The band spans the plot's whole height: only its steps count."""
        height = self.rect()
        band = QRectF(QPointF(p1.x(), height.top()), QPointF(p2.x(), height.bottom()))
        band = self.childGroup.mapRectFromParent(band.normalized())
        self.rbScaleBox.setPos(band.topLeft())
        self.rbScaleBox.setTransform(QTransform.fromScale(band.width(), band.height()))
        self.rbScaleBox.show()
