"""How a layer status looks everywhere in the app: colours, icons, labels, number text.

One place, so the tree, the plots and the events list agree that red means NaN/Inf, orange
exploding and blue vanishing.
"""

from __future__ import annotations

import math
from functools import cache

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QIcon, QPainter, QPen, QPixmap, QPolygonF

from gradscope.core.facts import EarlyWarning
from gradscope.core.watch import (
    STATUS_EXPLODING,
    STATUS_FROZEN,
    STATUS_NO_GRADIENT,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_VANISHING,
)

STATUS_COLORS = {
    STATUS_FROZEN: "#9e9e9e",
    STATUS_NO_GRADIENT: "#9e9e9e",
    STATUS_OK: "#2ca02c",
    STATUS_SKIPPED: "#9467bd",
    STATUS_VANISHING: "#1f77b4",
    STATUS_EXPLODING: "#f07f0e",
    STATUS_NONFINITE: "#d62728",
}
# Light tints for row backgrounds: readable with black text.
STATUS_TINTS = {
    STATUS_VANISHING: "#dcebf8",
    STATUS_EXPLODING: "#ffe8cc",
    STATUS_NONFINITE: "#fbd5d5",
}
STATUS_LABELS = {
    STATUS_FROZEN: "frozen",
    STATUS_NO_GRADIENT: "no gradient",
    STATUS_OK: "ok",
    STATUS_SKIPPED: "skipped (overflow)",
    STATUS_VANISHING: "vanishing",
    STATUS_EXPLODING: "exploding",
    STATUS_NONFINITE: "NaN/Inf",
}
# What each status means and when the engine sets it, for tooltips (the README's table).
STATUS_MEANINGS = {
    STATUS_FROZEN: "its parameters do not require gradients",
    STATUS_NO_GRADIENT: "trainable, but it got no gradient at this step",
    STATUS_OK: "its gradient norm is between the vanishing and exploding thresholds",
    STATUS_SKIPPED: (
        "the loss scaler skipped this step: its own scaled gradients overflowed (expected in "
        "mixed precision; a non-finite loss or batch is NaN/Inf, never skipped)"
    ),
    STATUS_VANISHING: (
        "its gradient norm stayed under the vanishing threshold for 3 consecutive measured steps"
    ),
    STATUS_EXPLODING: "its gradient norm is above the exploding threshold",
    STATUS_NONFINITE: "its gradient holds NaN or Inf",
}


def status_tooltip(status: int | None, why: str | None = None) -> str:
    """A status in words: its label, what it means, and why when the engine says (a tiny
    gradient behind a zero or tiny scale). ``None``: no step measured the layer."""
    if status is None:
        return "no status: no step measured this layer yet"
    text = f"{status_label(status)}: {STATUS_MEANINGS.get(status, 'a status of the engine')}"
    return f"{text}. Why: {why}" if why else text


# How much a status needs attention, for "the worst inside this module": the engine numbers
# its statuses by severity (frozen < no gradient < ok < skipped < vanishing < exploding <
# nonfinite), so the code itself ranks them.


def severity(status: int) -> float:
    return float(status)


def status_label(status: int) -> str:
    """The app's word for a status code, including codes added to the engine later."""
    if status in STATUS_LABELS:
        return STATUS_LABELS[status]
    from gradscope.core.watch import STATUS_NAMES

    if 0 <= status < len(STATUS_NAMES):
        return STATUS_NAMES[status].replace("_", " ")
    return f"status {status}"


# An early warning (spiking, drifting, low headroom: gradscope.core.warnings) is no status of
# the gradient but a precursor: gold, apart from exploding's orange, and a diamond badge.
WARNING_COLOR = "#c49a00"
WARNING_TINT = "#fff4bf"
# Drawn plot guides of a warning: its limit and the projection to it.
WARNING_LIMIT_COLOR = "#b8860b"


def warning_tooltip(warning: EarlyWarning) -> str:
    """A warning in words: its kind and step, the evidence, and what practice does."""
    lines = [f"{warning.kind} at step {warning.step}: {warning.evidence}"]
    if warning.hint:
        lines.append(f"Hint: {warning.hint}")
    return "\n".join(lines)


ORIGIN_COLOR = "#8b0000"
ORIGIN_TINT = "#f4a6a6"
NONFINITE_MARKER_COLOR = STATUS_COLORS[STATUS_NONFINITE]
ZERO_MARKER_COLOR = STATUS_COLORS[STATUS_VANISHING]


def status_color(status: int) -> QColor:
    return QColor(STATUS_COLORS.get(status, "#7f7f7f"))


def format_value(value: float | None) -> str:
    """A statistic as short text: ``1.23e+10``, ``0.0457``, ``NaN``, ``Inf``."""
    if value is None:
        return ""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    return f"{value:.3g}"


def _canvas(size: int = 16) -> tuple[QPixmap, QPainter]:
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    return pixmap, painter


@cache
def status_icon(status: int) -> QIcon:
    """A filled badge: a circle with "!" (NaN/Inf), an up triangle (exploding), a down
    triangle (vanishing); empty for ok."""
    pixmap, painter = _canvas()
    color = status_color(status)
    painter.setPen(QPen(color.darker(130), 1))
    painter.setBrush(QBrush(color))
    if status == STATUS_NONFINITE:
        painter.drawEllipse(QRectF(1.5, 1.5, 13, 13))
        painter.setPen(QPen(QColor("white"), 2.2))
        painter.drawLine(QPointF(8, 4.5), QPointF(8, 9.5))
        painter.drawPoint(QPointF(8, 12))
    elif status == STATUS_EXPLODING:
        painter.drawPolygon(QPolygonF([QPointF(8, 1.5), QPointF(15, 14.5), QPointF(1, 14.5)]))
    elif status == STATUS_VANISHING:
        painter.drawPolygon(QPolygonF([QPointF(1, 1.5), QPointF(15, 1.5), QPointF(8, 14.5)]))
    painter.end()
    return QIcon(pixmap)


@cache
def warning_icon() -> QIcon:
    """A gold diamond with "!": an early warning (an up triangle is exploding's)."""
    pixmap, painter = _canvas()
    color = QColor(WARNING_COLOR)
    painter.setPen(QPen(color.darker(130), 1))
    painter.setBrush(QBrush(color))
    painter.drawPolygon(
        QPolygonF([QPointF(8, 0.5), QPointF(15.5, 8), QPointF(8, 15.5), QPointF(0.5, 8)])
    )
    painter.setPen(QPen(QColor("white"), 2.0))
    painter.drawLine(QPointF(8, 4), QPointF(8, 9))
    painter.drawPoint(QPointF(8, 11.8))
    painter.end()
    return QIcon(pixmap)


@cache
def origin_icon() -> QIcon:
    """A crosshair: the module where the first NaN/Inf was made."""
    pixmap, painter = _canvas()
    painter.setPen(QPen(QColor(ORIGIN_COLOR), 2))
    painter.setBrush(QBrush(QColor(STATUS_COLORS[STATUS_NONFINITE])))
    painter.drawEllipse(QRectF(3, 3, 10, 10))
    painter.drawLine(QPointF(8, 0), QPointF(8, 4))
    painter.drawLine(QPointF(8, 12), QPointF(8, 16))
    painter.drawLine(QPointF(0, 8), QPointF(4, 8))
    painter.drawLine(QPointF(12, 8), QPointF(16, 8))
    painter.end()
    return QIcon(pixmap)


@cache
def inside_icon(status: int) -> QIcon:
    """A small hollow badge for a parent whose subtree holds a flagged layer."""
    pixmap, painter = _canvas()
    color = status_color(status)
    painter.setPen(QPen(color, 2))
    painter.setBrush(Qt.BrushStyle.NoBrush)
    painter.drawEllipse(QRectF(3, 3, 10, 10))
    painter.setBrush(QBrush(color))
    painter.drawEllipse(QRectF(6, 6, 4, 4))
    painter.end()
    return QIcon(pixmap)
