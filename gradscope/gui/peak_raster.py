"""Hundreds of layers' lines drawn as one image (issue 17: zoom on 500 layers x 20,000 steps).

The gradient-norm plot shows every grouped layer as a line through its per-block minimum and
maximum (peak downsampling to about one block a pixel column). Drawn by Qt, that is about
310,000 line segments of 500 layers at each zoom or pan: 25-30 ms of the paint, whose cost
is per segment. Here the same lines are rasterised with numpy: each layer's line becomes one
vertical run of pixels per pixel column it crosses (a column's run covers the block's
minimum to maximum and the parts of the lines to its neighbours that fall in that column),
all runs go into one index image in a few array passes, and Qt draws that image once. Every
pixel a layer's line passes through is coloured (by the layer drawn last there, as when the
lines are drawn one after the other); nothing shown is dropped. The image is kept until the
data, the view range or the size change: a repaint for a hover label or a selection only
draws it again.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QColor, QImage


def _premultiplied_argb(color: QColor) -> int:
    alpha = color.alpha()
    red, green, blue = (round(c * alpha / 255) for c in (color.red(), color.green(), color.blue()))
    return (alpha << 24) | (red << 16) | (green << 8) | blue


def line_runs(
    x: np.ndarray, low: np.ndarray, high: np.ndarray, width: int, height: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pixel runs that draw each layer's line, in an image ``width`` x ``height``.

    ``x`` (n points, increasing) and ``low``/``high`` (layers x n) are pixel coordinates
    (x to the right, rows downwards; NaN where a layer has no value). A layer's line is
    the one pyqtgraph's peak mode draws: at each point a vertical stroke from ``low`` to
    ``high``, and from there a straight segment to the next point's ``low`` when both are
    finite (a NaN breaks the line). Returns the runs as (column, first row, last row,
    layer): a run covers every row the line passes through in its pixel column, clipped
    to the image; runs entirely outside it are left out.
    """
    layers, count = low.shape
    if not count or not layers:
        empty = np.zeros(0, dtype=np.int32)
        return empty, empty, empty, empty
    x = np.asarray(x, dtype=np.float64)
    columns = np.floor(x).astype(np.int32)
    gaps = np.diff(x)
    crossed = np.maximum(columns[1:] - columns[:-1] - 1, 0) if count > 1 else np.zeros(0, np.int32)
    extra = int(crossed.sum())
    span = count + extra
    dtype = np.result_type(low.dtype, high.dtype, np.float32)
    # One row per layer: first a run at each point, then one in each column that a
    # segment crosses whole.
    top = np.empty((layers, span), dtype=dtype)
    bottom = np.empty((layers, span), dtype=dtype)
    run_columns = np.empty(span, dtype=np.int32)
    run_columns[:count] = columns
    np.fmin(low, high, out=top[:, :count])
    np.fmax(low, high, out=bottom[:, :count])
    if count > 1:
        start, end = high[:, :-1], low[:, 1:]
        rise = end - start
        with np.errstate(divide="ignore", invalid="ignore"):
            leave = np.where(gaps > 0, (np.minimum(columns[:-1] + 1.0, x[1:]) - x[:-1]) / gaps, 1)
            enter = np.where(gaps > 0, (np.maximum(columns[1:], x[:-1]) - x[:-1]) / gaps, 0)
        along = rise * leave.astype(dtype)
        along += start
        np.fmin(top[:, : count - 1], along, out=top[:, : count - 1])
        np.fmax(bottom[:, : count - 1], along, out=bottom[:, : count - 1])
        np.multiply(rise, enter.astype(dtype), out=along)
        along += start
        np.fmin(top[:, 1:count], along, out=top[:, 1:count])
        np.fmax(bottom[:, 1:count], along, out=bottom[:, 1:count])
        if extra:
            segment = np.repeat(np.arange(count - 1), crossed)
            column = (
                columns[:-1][segment]
                + 1
                + (np.arange(extra) - np.repeat(np.cumsum(crossed) - crossed, crossed))
            )
            run_columns[count:] = column
            first = ((column - x[:-1][segment]) / gaps[segment]).astype(dtype)
            last = ((column + 1 - x[:-1][segment]) / gaps[segment]).astype(dtype)
            at_first = start[:, segment] + first * rise[:, segment]
            at_last = start[:, segment] + last * rise[:, segment]
            np.fmin(at_first, at_last, out=top[:, count:])
            np.fmax(at_first, at_last, out=bottom[:, count:])
    # NaN compares false: layers with no value there have no run.
    shown = bottom >= 0
    shown &= top < height
    inside = (run_columns >= 0) & (run_columns < width)
    if not inside.all():  # (points just outside the view, at its edges)
        shown &= inside
    where = np.flatnonzero(shown)
    layer = where // span  # (np.divmod is ten times slower)
    position = where - layer * span
    top = top.ravel()[where]
    bottom = bottom.ravel()[where]
    first_row = np.ceil(top - 0.5)
    last_row = np.ceil(bottom - 0.5)
    last_row -= 1
    short = np.flatnonzero(last_row < first_row)
    if len(short):
        first_row[short] = last_row[short] = np.floor((top[short] + bottom[short]) / 2)
    np.clip(first_row, 0, height - 1, out=first_row)
    np.clip(last_row, 0, height - 1, out=last_row)
    return (
        run_columns[position],
        first_row.astype(np.int32),
        last_row.astype(np.int32),
        layer.astype(np.int32),
    )


# The largest blocks rasterize writes are 2**_TOP_LEVEL pixels; a longer run is written as
# several of them.
_TOP_LEVEL = 5


def rasterize(
    x: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    color_index: np.ndarray,
    width: int,
    height: int,
) -> np.ndarray:
    """A ``height`` x ``width`` image of colour indices (0: nothing drawn) of the layers'
    lines (see :func:`line_runs`). Where lines cross, the larger colour index shows (the
    one drawn last)."""
    column, first_row, last_row, layer = line_runs(x, low, high, width, height)
    if not len(column):
        return np.zeros((height, width), dtype=np.uint16)
    # Each pixel shows the largest colour of the runs over it. Runs overlap (500 layers'
    # runs cover each pixel about ten times over), so they are not written pixel by pixel:
    # a run of length n is written as two blocks of the largest power of two 2^j <= n, one
    # at each end, into level j of a table of blocks (a sparse table, as for range-maximum
    # queries). Each level then hands its blocks down to the level below as two halves;
    # level 0 is the image. Work: two writes per run and a few passes over the image.
    lengths = last_row - first_row + 1
    # floor(log2(length)), exact; at most _TOP_LEVEL (the table's size is levels x image).
    level = np.minimum(np.frexp(lengths)[1] - 1, _TOP_LEVEL)
    levels = int(level.max()) + 1
    size = width * height
    table = np.zeros(levels * size, dtype=np.uint16)  # level, then column after column
    corner = level.astype(np.int64) * size + column.astype(np.int64) * height
    colors = np.asarray(color_index, dtype=np.uint16)[layer]
    block = 1 << level
    np.maximum.at(table, corner + first_row, colors)
    np.maximum.at(table, corner + last_row - (block - 1), colors)
    long = np.flatnonzero(lengths > 2 * block)  # (a few: steep segments, spikes)
    if len(long):
        # Blocks of the top level between those two ends, one every block length.
        inner = (lengths[long] - 1) // block[long] - 1
        run = np.repeat(long, inner)
        step = np.arange(len(run)) - np.repeat(np.cumsum(inner) - inner, inner) + 1
        np.maximum.at(table, corner[run] + first_row[run] + step * block[run], colors[run])
    table = table.reshape(levels, width, height)
    for j in range(levels - 1, 0, -1):
        half = 1 << (j - 1)
        blocks = table[j, :, : height - half]  # a block of 2^j starts at most there
        below = table[j - 1]
        np.maximum(below[:, : height - half], blocks, out=below[:, : height - half])
        np.maximum(below[:, half:], blocks, out=below[:, half:])
    return table[0].T


class PeakRasterItem(pg.GraphicsObject):
    """Layers' lines through points ``x`` with per-point ``low``/``high`` values (view
    coordinates), each in its colour, drawn 1 px wide, not antialiased, as one image."""

    def __init__(self) -> None:
        super().__init__()
        self._x = np.zeros(0)
        self._low = np.zeros((0, 0))
        self._high = np.zeros((0, 0))
        self._color_index = np.zeros(0, dtype=np.uint16)
        self._palette = np.zeros(1, dtype=np.uint32)
        self._bounds: QRectF | None = None
        self._version = 0
        self._image: QImage | None = None
        self._image_key: tuple | None = None
        self._image_at = QPointF()
        self.rasterized = 0  # images made (a repaint with nothing changed makes none)

    def set_data(
        self,
        x: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        color_index: np.ndarray,
        colors: list[QColor],
    ) -> None:
        """``low``/``high``: layers x points (equal for plain points; NaN: no value, the
        line breaks). ``color_index[i]`` (1-based) picks layer i's colour in ``colors``;
        a larger index is drawn over a smaller one."""
        self._x = np.asarray(x, dtype=np.float64)
        self._low, self._high = low, high
        self._color_index = np.asarray(color_index, dtype=np.uint16)
        self._palette = np.array([0, *(_premultiplied_argb(c) for c in colors)], dtype=np.uint32)
        self._version += 1
        bounds = None
        if low.size:
            # fmin/fmax pass NaN over: one pass each for the bounds of the finite values.
            lowest = np.fmin.reduce(low, axis=0)
            points = np.flatnonzero(np.isfinite(lowest))
            if len(points):
                x0, x1 = float(self._x[points[0]]), float(self._x[points[-1]])
                y0, y1 = float(np.fmin.reduce(lowest)), float(np.fmax.reduce(high, axis=None))
                bounds = QRectF(x0, y0, x1 - x0, y1 - y0)
        if bounds != self._bounds:
            self.prepareGeometryChange()
            self._bounds = bounds
        self.informViewBoundsChanged()
        self.update()

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange=None):
        if self._bounds is None:
            return (None, None)
        if ax == 0:
            return (self._bounds.left(), self._bounds.right())
        if orthoRange is None:
            return (self._bounds.top(), self._bounds.bottom())
        inside = (self._x >= orthoRange[0]) & (self._x <= orthoRange[1])
        low, high = self._low[:, inside], self._high[:, inside]
        finite = np.isfinite(low) & np.isfinite(high)
        if not finite.any():
            return (None, None)
        return (float(low[finite].min()), float(high[finite].max()))

    def pixelPadding(self) -> float:
        # As pyqtgraph pads the view's auto-range around a curve of a 1 px pen, so that the
        # views range as they did when these lines were curves.
        return 0.7072

    def boundingRect(self) -> QRectF:
        return QRectF() if self._bounds is None else QRectF(self._bounds)

    def paint(self, p, opt, widget) -> None:
        view = self.getViewBox()
        if self._bounds is None or view is None:
            return
        transform = p.worldTransform()
        if transform.m12() or transform.m21():
            return  # the plots never rotate their views
        # The pixels the painter really draws on (a high-density screen, or a widget rendered
        # into a larger pixmap): the painter's device can be the widget, at a ratio of 1.
        engine = p.paintEngine()
        device = engine.paintDevice() if engine is not None else p.device()
        ratio = device.devicePixelRatioF() if device is not None else 1.0
        area = transform.mapRect(view.viewRect())
        left, top = math.floor(area.left()), math.floor(area.top())
        width = max(0, math.ceil(area.right()) - left)
        height = max(0, math.ceil(area.bottom()) - top)
        if not width or not height:
            return
        key = (
            self._version,
            transform.m11(),
            transform.m22(),
            transform.dx(),
            transform.dy(),
            left,
            top,
            width,
            height,
            ratio,
        )
        if key != self._image_key:
            self._image = self._rasterize(transform, left, top, width, height, ratio)
            self._image_key = key
            self._image_at = QPointF(left, top)
        p.save()
        p.resetTransform()
        p.drawImage(self._image_at, self._image)
        p.restore()

    def _rasterize(
        self, transform, left: int, top: int, width: int, height: int, ratio: float
    ) -> QImage:
        # Device pixels of the points, relative to the image's corner.
        x = self._x * (transform.m11() * ratio) + (transform.dx() - left) * ratio
        scale = np.float32(transform.m22() * ratio)
        offset = np.float32((transform.dy() - top) * ratio)
        low = np.multiply(self._low, scale, dtype=np.float32)
        low += offset
        if self._high is self._low:  # single steps, not blocks: one value a point
            high = low
        else:
            high = np.multiply(self._high, scale, dtype=np.float32)
            high += offset
        columns, rows = round(width * ratio), round(height * ratio)
        indices = rasterize(x, low, high, self._color_index, columns, rows)
        pixels = np.ascontiguousarray(self._palette[indices])  # rows of ARGB pixels
        image = QImage(
            pixels.data, columns, rows, columns * 4, QImage.Format.Format_ARGB32_Premultiplied
        ).copy()
        image.setDevicePixelRatio(ratio)
        self.rasterized += 1
        return image
