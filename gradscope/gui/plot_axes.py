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

import itertools
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QLineF, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPen
from PySide6.QtWidgets import QGraphicsItem

# Below the ViewBox (z -100 in its PlotItem), so the grid is under the data.
_BEHIND_DATA_Z = -150
# Tick labels' boxes by font, resolution and text (see GridAxis._label_rect).
_LABEL_BOXES: dict[tuple[str, int, str], tuple[float, float, float, float]] = {}


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
    return shortened if len(shortened) <= limit else "…" + shortened[-(limit - 1) :]


def opaque_over(color: QColor, background: QColor) -> QColor:
    """The opaque colour that ``color`` (with its alpha) shows over ``background``."""
    alpha = color.alphaF()
    return QColor(
        *(
            round(c * alpha + b * (1 - alpha))
            for c, b in (
                (color.red(), background.red()),
                (color.green(), background.green()),
                (color.blue(), background.blue()),
            )
        )
    )


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def tick_text(value: float, spacing: float | None = None) -> str:
    """A tick label, the same on every axis of the app: ``0.05``, ``250``, and powers of
    ten as ``5·10¹⁰`` (linear axes wrote ``5e+10`` beside log axes' ``5·10¹⁰``). With the
    ``spacing`` of the ticks, as many digits as tell neighbouring ticks apart (zoomed in
    on step 10,000, ticks 5 apart read ``10⁴``, ``1.0005·10⁴``, not ``10⁴`` twice)."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    needed = 0
    if spacing is not None and spacing > 0:
        needed = min(15, math.floor(math.log10(abs(value))) - math.floor(math.log10(spacing)) + 1)
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.{max(4, needed)}g}"
    mantissa, exponent = f"{value:.{max(2, needed - 1)}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    power = "10" + str(int(exponent)).translate(_SUPERSCRIPT)
    if mantissa in ("1", "-1"):
        return power if mantissa == "1" else "-" + power
    return f"{mantissa}·{power}"


# Tick spacings of a time axis, in seconds: what a clock shows (5 s, 15 s, 1 min, 15 min...).
_TIME_SPACINGS = (
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    432000,
    864000,
)


def elapsed_text(seconds: float, spacing: float = 1.0) -> str:
    """Seconds since the first step as a clock reads them: ``0:00:05``, ``1:30:00``,
    ``2d 3:00:00``; tenths while the ticks are under a second apart (``0:00:01.5``)."""
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    tenths = spacing < 1
    if tenths:
        seconds = round(seconds, 1)
    else:
        seconds = round(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, rest = divmod(rest, 60)
    clock = f"{int(hours)}:{int(minutes):02d}:" + (
        f"{rest:04.1f}" if tenths else f"{int(rest):02d}"
    )
    return sign + (f"{int(days)}d {clock}" if days else clock)


def time_tick_values(low: float, high: float, pixels: float) -> list:
    """Major ticks at a clock-like spacing with about 90 px between labels (an h:mm:ss label
    is wide), and minor ones between them."""
    span = max(high - low, 1e-9)
    wanted = span * 90 / max(pixels, 1)
    major = next((s for s in _TIME_SPACINGS if s >= wanted), _TIME_SPACINGS[-1])
    while major < wanted:
        major *= 2
    index = _TIME_SPACINGS.index(major) if major in _TIME_SPACINGS else -1
    minor = _TIME_SPACINGS[index - 1] if index > 0 else major / 2

    def ticks(spacing: float) -> list[float]:
        first = math.ceil(low / spacing)
        last = math.floor(high / spacing)
        return [k * spacing for k in range(first, last + 1)][:1000]

    majors = ticks(major)
    minors = [v for v in ticks(minor) if not any(abs(v - m) < 1e-9 for m in majors)]
    return [(major, majors), (minor, minors)]


# Within a decade, the mantissas labelled, from the sparsest to the densest (1 alone, then
# 1-2-5...): the densest whose closest pair of labels is still a label apart.
_MANTISSAS = ((1,), (1, 2, 5), (1, 2, 3, 5), (1, 2, 3, 4, 5, 6, 8), tuple(range(1, 10)))
_DECADE_STEPS = (1, 2, 3, 5, 10, 20, 25, 50, 100, 200, 500)


def _nice(value: float) -> float:
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value * (1 - 1e-9))


def log_tick_values(
    low: float, high: float, pixels: float, label_pixels: float
) -> tuple[list, set[float]]:
    """Ticks of a log axis from log10 ``low`` to ``high`` over ``pixels``, and the ticks
    that get a label: powers of ten at a spacing that fits (1, 2, 5... decades apart) with
    the top decade in view always named; 2 and 5 (and more) between them when fewer than two
    powers of ten are in view or there is room; evenly spaced values when zoomed within a
    decade. Labels are never closer than ``label_pixels``. Levels: (major: the labelled,
    minor: grid lines only)."""
    span = high - low
    per_decade = pixels / span
    eps = 1e-9
    first, last = math.ceil(low - eps), math.floor(high + eps)
    powers = list(range(first, last + 1))
    labelled: list[float] = []
    minor: list[float] = []
    if per_decade * 0.3 < label_pixels and powers:
        # Not even 1-2-5 fits: powers of ten only, every k-th.
        step = next(
            (k for k in _DECADE_STEPS if k * per_decade >= label_pixels * 1.4), _DECADE_STEPS[-1]
        )
        labelled = [float(p) for p in powers if p % step == 0]
        top = float(powers[-1])
        if top not in labelled and (
            not labelled or (top - labelled[-1]) * per_decade >= label_pixels * 1.2
        ):
            labelled.append(top)  # the top decade in view is named
        minor = [float(p) for p in powers if float(p) not in labelled]
        if step == 1 or per_decade >= 20:
            minor += [p + math.log10(m) for p in range(first - 1, last + 1) for m in range(2, 10)]
    else:
        # Between powers of ten only with room to spare (a label every few lines reads
        # better than a column of them); as tight as fits only when that leaves fewer than
        # two labels in view.
        def with_room(room: float) -> list[float]:
            chosen: list[float] = []
            for mantissas in _MANTISSAS:
                closest = min(math.log10(b / a) for a, b in itertools.pairwise((*mantissas, 10)))
                if closest * per_decade < room:
                    break
                chosen = [
                    p + math.log10(m)
                    for p in range(first - 1, last + 1)
                    for m in mantissas
                    if low - eps <= p + math.log10(m) <= high + eps
                ]
            return chosen

        chosen = with_room(label_pixels * 1.8)
        if len(chosen) < 2:
            chosen = with_room(label_pixels)
        labelled = chosen
        if len(labelled) < 2:
            # Zoomed in within a decade: evenly spaced values, as far apart at the top
            # (where a log axis packs them closest) as a label.
            bottom_value, top_value = 10.0**low, 10.0**high
            spacing = _nice((top_value - bottom_value) / max(2.0, pixels / label_pixels / 1.5))
            while top_value / max(top_value - spacing, 1e-300) < 10 ** (label_pixels / per_decade):
                spacing = _nice(spacing * 1.01)
            start = math.ceil(bottom_value / spacing - eps)
            values = [k * spacing for k in range(start, start + 1000)]
            labelled = [math.log10(v) for v in values if v <= top_value * (1 + eps) and v > 0]
        minor = [
            p + math.log10(m)
            for p in range(first - 1, last + 1)
            for m in range(1, 10)
            if low <= p + math.log10(m) <= high
        ]
    keys = {round(v, 9) for v in labelled}
    minor = [v for v in minor if low <= v <= high and round(v, 9) not in keys]
    return [(1.0, labelled), (None, minor)], keys


class GridAxis(pg.AxisItem):
    """An axis whose ticks and grid lines are opaque, drawn behind the plot's data, with
    the app's tick labels (:func:`tick_text`); with ``time_ticks`` a step axis of seconds
    since the first step, labelled h:mm:ss."""

    time_ticks = False
    # The axis's label at its start instead of its middle: the flow chart's threshold names
    # would run under the statistic box in the chart's bottom-right corner at 1280x800.
    label_at_start = False

    def resizeEvent(self, event: object = None) -> None:
        super().resizeEvent(event)
        if self.label_at_start and self.orientation == "bottom":
            self.label.setPos(4, self.label.pos().y())

    def set_time_ticks(self, on: bool) -> None:
        if on != self.time_ticks:
            self.time_ticks = on
            self.picture = None
            self.update()

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list:
        low, high = min(minVal, maxVal), max(minVal, maxVal)
        if self.time_ticks and not self.logMode:
            levels = time_tick_values(low, high, size)
            self._time_major = levels[0][0]
            return levels
        if self.logMode and high > low and math.isfinite(high - low):
            levels, labelled = log_tick_values(low, high, size, self._label_pixels())
            self._log_labels = ((low, high), labelled)
            return levels
        return super().tickValues(minVal, maxVal, size)

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        if self.time_ticks and not self.logMode:
            if spacing < getattr(self, "_time_major", spacing) - 1e-9:
                return [None] * len(values)  # minor ticks: grid lines only
            return [elapsed_text(v, spacing) for v in values]
        if self.logMode:
            return self.logTickStrings(values, scale, spacing)
        # Round away float noise of the tick positions (0.30000000000000004).
        digits = max(0, -math.floor(math.log10(spacing * scale))) + 1 if spacing > 0 else 6
        return [
            tick_text(
                round(v * scale, digits) if abs(v * scale) < 1e4 else v * scale, spacing * scale
            )
            for v in values
        ]

    def logTickStrings(self, values: list[float], scale: float, spacing: float) -> list[str | None]:
        # The labelled ticks are those log_tick_values chose for this range (they never
        # overlap, and there are at least two); an unlabelled tick gets None, not "":
        # pyqtgraph then skips it instead of measuring and placing an empty label.
        chosen = self._log_labels
        if chosen is not None and chosen[0] == tuple(sorted(self.range)):
            labelled = chosen[1]
            return [tick_text(10**v * scale) if round(v, 9) in labelled else None for v in values]
        # Not chosen for this range (a direct call): over more than a decade only the
        # powers of ten.
        low, high = sorted(self.range)
        decades = high - low
        labels: list[str | None] = []
        for v in values:
            if decades > 1.2 and abs(v - round(v)) > 1e-6:
                labels.append(None)
            else:
                labels.append(tick_text(10**v * scale))
        return labels

    _log_labels: tuple[tuple[float, float], set[float]] | None = None

    def _label_pixels(self) -> float:
        """Pixels a tick label takes along the axis, with a gap (kept per font)."""
        font = self.style.get("tickFont") or QFont()
        kept = getattr(self, "_label_pixels_kept", None)
        if kept is not None and kept[0] == font.key():
            return kept[1]
        metrics = QFontMetrics(font)
        if self.orientation in ("left", "right"):
            pixels = metrics.height() * 0.8 + 5
        else:
            pixels = metrics.horizontalAdvance("5·10⁻¹⁰") + 10
        self._label_pixels_kept = (font.key(), pixels)
        return pixels

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

    def generateDrawSpecs(self, p):
        """pyqtgraph's AxisItem.generateDrawSpecs with the same result (a test compares
        them), made for the five axes redrawn at each zoom (issue 17): tick ends as
        QPointF, not pyqtgraph's Point (a Python constructor, two per tick: a 13-decade
        log axis has 150 ticks); label sizes measured once per text and font; the axis's
        bounding rectangle taken once, not once per label."""
        if self.style["tickFont"] is not None:
            p.setFont(self.style["tickFont"])
        bounds = self.mapRectFromParent(self.geometry())
        linked = self.linkedView()
        if linked is None or self.grid is False:
            tick_bounds = bounds
        else:
            tick_bounds = linked.mapRectToItem(self, linked.boundingRect())
        orientation = self.orientation
        if orientation == "left":
            span = (
                bounds.topRight() + QPointF(-1.0, -1.0),
                bounds.bottomRight() + QPointF(-1.0, 1.0),
            )
            tick_start, tick_stop, tick_dir, axis = tick_bounds.right(), bounds.right(), -1, 0
        elif orientation == "right":
            span = (bounds.topLeft() + QPointF(1.0, -1.0), bounds.bottomLeft() + QPointF(1.0, 1.0))
            tick_start, tick_stop, tick_dir, axis = tick_bounds.left(), bounds.left(), 1, 0
        elif orientation == "top":
            span = (
                bounds.bottomLeft() + QPointF(-1.0, -1.0),
                bounds.bottomRight() + QPointF(1.0, -1.0),
            )
            tick_start, tick_stop, tick_dir, axis = tick_bounds.bottom(), bounds.bottom(), -1, 1
        elif orientation == "bottom":
            span = (bounds.topLeft() + QPointF(-1.0, 1.0), bounds.topRight() + QPointF(1.0, 1.0))
            tick_start, tick_stop, tick_dir, axis = tick_bounds.top(), bounds.top(), 1, 1
        else:
            raise ValueError("self.orientation must be in {'left', 'right', 'top', 'bottom'}")
        points = [self.mapToDevice(point) for point in span]
        if None in points:
            return None
        length = math.hypot(points[1].x() - points[0].x(), points[1].y() - points[0].y())
        if length == 0:
            return None
        if self._tickLevels is None:
            tick_levels = self.tickValues(self.range[0], self.range[1], length)
            tick_strings = None
        else:
            tick_levels, tick_strings = [], []
            for level in self._tickLevels:
                tick_levels.append((None, [value for value, _ in level]))
                tick_strings.append([text for _, text in level])
        difference = self.range[1] - self.range[0]
        if difference == 0:
            scale, offset = 1, 0
        elif axis == 0:
            scale = -bounds.height() / difference
            offset = self.range[0] * scale - bounds.height()
        else:
            scale = bounds.width() / difference
            offset = self.range[0] * scale
        ends = [x * scale - offset for x in self.range]
        low_end, high_end = min(ends), max(ends)
        tick_positions: list[list[float | None]] = []
        tick_specs = []
        for i, (_, ticks) in enumerate(tick_levels):
            positions: list[float | None] = []
            tick_positions.append(positions)
            tick_length = self.style["tickLength"] / ((i * 0.5) + 1.0)
            alpha = self.style["tickAlpha"]
            if alpha is None:
                alpha = 255 / (i + 1)
                if self.grid is not False:
                    alpha *= (
                        self.grid / 255.0 * min(max(0.05 * length / (len(ticks) + 1), 0.0), 1.0)
                    )
            elif isinstance(alpha, float):
                alpha = min(255, max(0, round(alpha * 255)))
            elif isinstance(alpha, int):
                if alpha > 255 or alpha < 0:
                    raise ValueError("lineAlpha should be [0..255]")
            else:
                raise TypeError("Line Alpha should be of type None, float or int")
            pen = self.tickPen()
            if pen.brush().style() == Qt.BrushStyle.SolidPattern:
                pen = QPen(pen)
                color = QColor(pen.color())
                color.setAlpha(int(alpha))
                pen.setColor(color)
            far = tick_stop if self.grid is not False else tick_stop + tick_length * tick_dir
            for value in ticks:
                x = value * scale - offset
                if x < low_end or x > high_end:
                    positions.append(None)
                    continue
                positions.append(x)
                if axis == 0:
                    tick_specs.append((pen, QPointF(tick_start, x), QPointF(far, x)))
                else:
                    tick_specs.append((pen, QPointF(x, tick_start), QPointF(x, far)))
        if self.style["stopAxisAtTick"][0] is True:
            first = min(min(x for x in level if x is not None) for level in tick_positions)
            if axis == 0:
                span[0].setY(max(span[0].y(), first))
            else:
                span[0].setX(max(span[0].x(), first))
        if self.style["stopAxisAtTick"][1] is True:
            last = max(max(x for x in level if x is not None) for level in tick_positions)
            if axis == 0:
                span[1].setY(min(span[1].y(), last))
            else:
                span[1].setX(min(span[1].x(), last))
        axis_spec = (self.pen(), span[0], span[1])
        text_offset = self.style["tickTextOffset"][axis]
        text_size2 = last_text_size2 = 0
        text_rects: list[QRectF] = []
        text_specs = []
        if not self.style["showValues"]:
            return axis_spec, tick_specs, text_specs
        font_key = (p.font().key(), p.device().logicalDpiY() if p.device() is not None else 0)
        own_rect = self.boundingRect()
        for i in range(min(len(tick_levels), self.style["maxTextLevel"] + 1)):
            if tick_strings is None:
                spacing, values = tick_levels[i]
                strings = self.tickStrings(values, self.autoSIPrefixScale * self.scale, spacing)
            else:
                strings = tick_strings[i]
            if len(strings) == 0:
                continue
            strings = [
                None if tick_positions[i][j] is None else text for j, text in enumerate(strings)
            ]
            rects: list[QRectF | None] = []
            for text in strings:
                if text is None:
                    rects.append(None)
                    continue
                rect = self._label_rect(p, font_key, text)
                rects.append(rect)
                text_rects.append(rect)
            if text_rects:
                if axis == 0:
                    text_size = float(np.sum([r.height() for r in text_rects]))
                    text_size2 = float(np.max([r.width() for r in text_rects]))
                else:
                    text_size = float(np.sum([r.width() for r in text_rects]))
                    text_size2 = float(np.max([r.height() for r in text_rects]))
            else:
                text_size = text_size2 = 0
            if i > 0:
                fill = text_size / length
                if any(
                    len(text_specs) >= count and fill >= limit
                    for count, limit in self.style["textFillLimits"]
                ):
                    break
            last_text_size2 = text_size2
            gap = max(0, self.style["tickLength"]) + text_offset
            for j, text in enumerate(strings):
                if text is None:
                    continue
                x = tick_positions[i][j]
                height, width = rects[j].height(), rects[j].width()
                if orientation == "left":
                    flags = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                    rect = QRectF(tick_stop - gap - width, x - height / 2, width, height)
                elif orientation == "right":
                    flags = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
                    rect = QRectF(tick_stop + gap, x - height / 2, width, height)
                elif orientation == "top":
                    flags = Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom
                    rect = QRectF(x - width / 2.0, tick_stop - gap - height, width, height)
                else:
                    flags = Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop
                    rect = QRectF(x - width / 2.0, tick_stop + gap, width, height)
                if own_rect & rect != rect:
                    continue
                text_specs.append((rect, flags | Qt.TextFlag.TextDontClip, text))
        self._updateMaxTextSize(last_text_size2)
        return axis_spec, tick_specs, text_specs

    @staticmethod
    def _label_rect(p, font_key: tuple[str, int], text: str) -> QRectF:
        """pyqtgraph's label box (the text's bounding box centred in a 100 px square, 80% of
        its height), measured once per font, resolution and text."""
        key = (*font_key, text)
        box = _LABEL_BOXES.get(key)
        if box is None:
            if len(_LABEL_BOXES) > 4096:
                _LABEL_BOXES.clear()
            rect = p.boundingRect(QRectF(0, 0, 100, 100), Qt.AlignmentFlag.AlignCenter, text)
            box = _LABEL_BOXES[key] = (rect.x(), rect.y(), rect.width(), rect.height() * 0.8)
        return QRectF(*box)

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

    def set_names(self, names: list[str]) -> None:
        """Show ``names``; the axis is redrawn only when they changed."""
        if self.names != names:
            self.names = names
            self.picture = None
            self.update()

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
