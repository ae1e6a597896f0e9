"""The plots' axes: grid lines drawn opaque and behind the data, and the layer-name axis.

pyqtgraph draws a grid as part of each axis, in the tick pen's colour at the grid's alpha
(fading further for a log axis's minor ticks), above the data. Qt's raster engine draws
semi-transparent lines without antialiasing about 25 times slower than opaque ones: the 150
grid lines of a log axis spanning 13 decades took 25 ms, a third of a zoom. ``GridAxis``
draws the same lines in the opaque colour they have over the plot background, and sits
behind the data (so an opaque line never hides a curve; grid under data is also the usual
look). Each axis is drawn into a pixmap kept until its range or size changes: a new curve
point repaints the area behind it, which would otherwise replay every tick label and grid
line at each refresh.
"""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import QLineF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPen
from PySide6.QtWidgets import QGraphicsItem

# Below the ViewBox (z -100 in its PlotItem), so the grid is under the data.
_BEHIND_DATA_Z = -150


def _abbreviate(part: str) -> str:
    """``denseblock4`` -> ``den4``, ``encoder_layer_11`` -> ``enc11``, ``0`` -> ``0``: a
    path component's first letters and its index, which tells sibling blocks apart."""
    letters = "".join(c for c in part if not c.isdigit()).strip("_")
    digits = "".join(c for c in part if c.isdigit())
    return (letters[:3] + digits) or part


def elide(name: str, limit: int = 26) -> str:
    """A layer name in at most ``limit`` characters; the root is "(model)". The last
    component stays whole and every block index stays: the components before it are
    abbreviated from the left (``features.denseblock4.denselayer16.conv2`` ->
    ``fea.den4.den16.conv2``); only what still does not fit is cut from the left."""
    name = name or "(model)"
    if len(name) <= limit:
        return name
    parts = name.split(".")
    for i in range(len(parts) - 1):
        parts[i] = _abbreviate(parts[i])
        shortened = ".".join(parts)
        if len(shortened) <= limit:
            return shortened
    shortened = ".".join(parts)
    return shortened if len(shortened) <= limit else "…" + shortened[-(limit - 1):]


def opaque_over(color: QColor, background: QColor) -> QColor:
    """The opaque colour that ``color`` (with its alpha) shows over ``background``."""
    alpha = color.alphaF()
    return QColor(
        *(round(c * alpha + b * (1 - alpha)) for c, b in (
            (color.red(), background.red()),
            (color.green(), background.green()),
            (color.blue(), background.blue()),
        ))
    )


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def tick_text(value: float) -> str:
    """A tick label, the same on every axis of the app: ``0.05``, ``250``, and powers of
    ten as ``5·10¹⁰`` (linear axes wrote ``5e+10`` beside log axes' ``5·10¹⁰``)."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.4g}"
    mantissa, exponent = f"{value:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    power = "10" + str(int(exponent)).translate(_SUPERSCRIPT)
    if mantissa in ("1", "-1"):
        return power if mantissa == "1" else "-" + power
    return f"{mantissa}·{power}"


class GridAxis(pg.AxisItem):
    """An axis whose ticks and grid lines are opaque, drawn behind the plot's data, with
    the app's tick labels (:func:`tick_text`)."""

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        if self.logMode:
            return self.logTickStrings(values, scale, spacing)
        # Round away float noise of the tick positions (0.30000000000000004).
        digits = max(0, -math.floor(math.log10(spacing * scale))) + 1 if spacing > 0 else 6
        return [tick_text(round(v * scale, digits) if abs(v * scale) < 1e4 else v * scale)
                for v in values]

    def logTickStrings(
        self, values: list[float], scale: float, spacing: float
    ) -> list[str | None]:
        # Over more than a decade, only the powers of ten are labelled: the 2..9 minor ticks
        # of every decade crowded into unreadable stacks ("0.1 0.09 0.08..."). An unlabelled
        # tick gets None, not "": pyqtgraph then skips it instead of measuring and placing an
        # empty label (about 100 of them on a 13-decade axis, at every zoom).
        low, high = sorted(self.range)
        decades = high - low
        labels: list[str | None] = []
        for v in values:
            if decades > 1.2 and abs(v - round(v)) > 1e-6:
                labels.append(None)
            else:
                labels.append(tick_text(10 ** v * scale))
        return labels

    def __init__(self, orientation: str) -> None:
        super().__init__(orientation)
        self.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)

    def place_behind_data(self) -> None:
        """Call once the axis is in its PlotItem (which puts its axes above the data)."""
        self.setZValue(_BEHIND_DATA_Z)

    def background(self) -> QColor | None:
        """The opaque colour of the view this axis is drawn on, or None (no view yet, or a
        transparent background: then the grid keeps pyqtgraph's translucent lines)."""
        scene = self.scene()
        views = scene.views() if scene is not None else []
        if not views:
            return None
        color = views[0].backgroundBrush().color()
        if views[0].backgroundBrush().style() == Qt.BrushStyle.NoBrush or color.alpha() < 255:
            return None
        return color

    def drawPicture(self, p, axisSpec, tickSpecs, textSpecs) -> None:
        # pyqtgraph's drawPicture, with each run of ticks that share a pen (pyqtgraph makes
        # one pen per tick level) drawn by one drawLines call, and each such pen made opaque
        # once: a log axis over 13 decades has ~150 ticks, which cost a pen copy, a setPen
        # and a drawLine each. Same lines, in the same order.
        background = self.background()
        p.setRenderHint(p.RenderHint.Antialiasing, False)
        p.setRenderHint(p.RenderHint.TextAntialiasing, True)
        pen, start, end = axisSpec
        p.setPen(pen)
        p.drawLine(start, end)
        runs: list[tuple[QPen, list[QLineF]]] = []
        for pen, start, end in tickSpecs:
            if not runs or runs[-1][0] is not pen:
                runs.append((pen, []))
            runs[-1][1].append(QLineF(start, end))
        for pen, lines in runs:
            p.setPen(self._opaque(pen, background) if background is not None else pen)
            p.drawLines(lines)
        if self.style["tickFont"] is not None:
            p.setFont(self.style["tickFont"])
        p.setPen(self.textPen())
        p.setClipRect(self.boundingRect().toAlignedRect())
        for rect, flags, text in textSpecs:
            p.drawText(rect, int(flags), text)

    @staticmethod
    def _opaque(pen: QPen, background: QColor) -> QPen:
        if pen.color().alpha() == 255:
            return pen
        pen = QPen(pen)
        pen.setColor(opaque_over(pen.color(), background))
        return pen


class LayerAxis(GridAxis):
    """Layer names at integer positions, thinned so that labels never overlap."""

    def __init__(self, orientation: str = "left") -> None:
        super().__init__(orientation)
        self.names: list[str] = []
        font = QFont()  # the application's family (an empty family name gives a serif)
        font.setPointSize(8)
        self.setStyle(tickFont=font)

    def needed_width(self) -> int:
        """Pixels the longest (elided) name needs, with the tick and its spacing."""
        if not self.names:
            return 0
        metrics = QFontMetrics(self.style.get("tickFont") or QFont())
        return max(metrics.horizontalAdvance(elide(name)) for name in self.names) + 14

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list:
        if not self.names:
            return []
        low = max(0, math.ceil(min(minVal, maxVal)))
        high = min(len(self.names) - 1, math.floor(max(minVal, maxVal)))
        if high < low:
            return []
        visible = high - low + 1
        step = max(1, math.ceil(visible * 15 / max(size, 1)))
        return [(float(step), list(range(low, high + 1, step)))]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        out = []
        for value in values:
            i = round(value)
            out.append(elide(self.names[i]) if 0 <= i < len(self.names) else "")
        return out
