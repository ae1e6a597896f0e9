"""A compared run's own NaN/Inf and skipped steps on a plot: hollow markers pinned to the
top edge (the shown run's are filled), and a red line in the run's line style at its first
NaN/Inf step, so that a run that blew up does not look like a run that ended (its dashed
curves just stopped there)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg

from gradscope.gui.mixed_precision import (
    SKIPPED_COLOR,
    SKIPPED_SYMBOL,
    SKIPPED_WORDS,
    skipped_rows,
)
from gradscope.gui.plots.compared_runs import ComparedRun, short_run_name
from gradscope.gui.status_style import NONFINITE_MARKER_COLOR

COMPARED_NONFINITE_WORDS = "compared run: NaN/Inf (hollow)"


@dataclass(frozen=True)
class RunMarks:
    """Where one compared run's marks go: ``x`` of each of its rows (its step or its time),
    which rows are NaN/Inf, which the loss scaler skipped, and what each NaN/Inf row held
    (shown on hover)."""

    run: ComparedRun
    x: np.ndarray
    nonfinite: np.ndarray  # bool per row
    skipped: np.ndarray  # bool per row
    kinds: list[str]  # per NaN/Inf row: "NaN ..." or "Inf ...", where


def layer_marks(run: ComparedRun, statistic: str, layers: list[str], x: np.ndarray) -> RunMarks:
    """``run``'s steps where one of ``layers`` (those it has) held a NaN/Inf ``statistic``,
    apart from the steps its loss scaler skipped as designed."""
    history = run.history
    count = history.count
    skipped = skipped_rows(history) if count else np.zeros(0, dtype=bool)
    columns = [history.column(name) for name in layers if history.has_layer(name)]
    if not count or not columns:
        return RunMarks(run, x, np.zeros(count, dtype=bool), skipped, [])
    values = history.matrix(statistic)[:, columns]
    bad = ~np.isfinite(values)
    nonfinite = bad.any(axis=1) & ~skipped
    names = [history.layer_names[c] for c in columns]
    kinds = []
    for row in np.flatnonzero(nonfinite).tolist():
        first = int(np.argmax(bad[row]))
        word = "NaN" if np.isnan(values[row, first]) else "Inf"
        kinds.append(f"{word} in {names[first] or '(model)'}")
    return RunMarks(run, x, nonfinite, skipped, kinds)


def loss_marks(run: ComparedRun, x: np.ndarray) -> RunMarks:
    """``run``'s steps whose loss was NaN/Inf, and those its loss scaler skipped."""
    history = run.history
    losses = history.losses
    nonfinite = ~np.isfinite(losses)
    skipped = skipped_rows(history) if history.count else np.zeros(0, dtype=bool)
    kinds = ["NaN loss" if np.isnan(value) else "Inf loss" for value in losses[nonfinite].tolist()]
    return RunMarks(run, x, nonfinite, skipped & ~nonfinite, kinds)


def compared_origin_words(run: ComparedRun) -> str:
    """Where ``run``'s first NaN/Inf came from, in a few words ("" for a healthy run)."""
    origin = run.history.first_nonfinite
    if origin is None:
        return ""
    if origin.phase == "input":
        where = "in the batch"
    elif origin.module is None:
        where = "outside the model"
    else:
        where = f"in {origin.module or '(model root)'}"
    return f"from step {origin.step}, {where}"


def _tip(x: float, y: float, data: object) -> str:
    return str(data)


class ComparedMarkers:
    """The compared runs' NaN/Inf and skipped steps on ``item``."""

    def __init__(self, item: pg.PlotItem) -> None:
        self.plot_item = item
        self.nonfinite = pg.ScatterPlotItem(
            size=12, pxMode=True, symbol="x", brush=None, hoverable=True, tip=_tip
        )
        self.skipped = pg.ScatterPlotItem(
            size=10,
            pxMode=True,
            symbol=SKIPPED_SYMBOL,
            brush=None,
            pen=pg.mkPen(SKIPPED_COLOR, width=1.5),
            hoverable=True,
            tip=_tip,
        )
        for scatter in (self.nonfinite, self.skipped):
            scatter.setZValue(18)
            item.addItem(scatter, ignoreBounds=True)
        self.first_lines: dict[str, pg.InfiniteLine] = {}
        self.marks: tuple[RunMarks, ...] = ()
        self._pen = pg.mkPen(NONFINITE_MARKER_COLOR, width=1.5)
        self._points: tuple[np.ndarray, list[str], list[str]] = (np.zeros(0), [], [])
        self._skipped_points: tuple[np.ndarray, list[str]] = (np.zeros(0), [])
        item.vb.sigRangeChanged.connect(self.place)
        item.vb.sigResized.connect(self.place)

    @property
    def nonfinite_points(self) -> list[tuple[str, int]]:
        """(run name, step) of each NaN/Inf marker drawn."""
        return [
            (marks.run.name, int(step))
            for marks in self.marks
            for step in marks.run.history.steps[marks.nonfinite]
        ]

    def refresh(self, marks: tuple[RunMarks, ...]) -> None:
        self.marks = marks
        wanted = set()
        x, symbols, data = [], [], []
        skipped_x, skipped_data = [], []
        for run_marks in marks:
            run = run_marks.run
            steps = run.history.steps
            rows = np.flatnonzero(run_marks.nonfinite)
            for row, kind in zip(rows.tolist(), run_marks.kinds, strict=True):
                x.append(run_marks.x[row])
                symbols.append("x" if kind.startswith("NaN") else "t1")
                data.append(f"{run.name}\nstep {int(steps[row])}: {kind}")
            for row in np.flatnonzero(run_marks.skipped).tolist():
                skipped_x.append(run_marks.x[row])
                skipped_data.append(f"{run.name}\nstep {int(steps[row])}: {SKIPPED_WORDS}")
            if not len(rows):
                continue
            wanted.add(run.name)
            line = self.first_lines.get(run.name)
            if line is None:
                line = pg.InfiniteLine(
                    angle=90,
                    pen=pg.mkPen(NONFINITE_MARKER_COLOR, width=1.2, style=run.line_style),
                    label=f"{short_run_name(run.name, 16)}: NaN/Inf",
                    # Right of the line: centred on it, the name was cut at a narrow plot's
                    # left edge.
                    labelOpts={
                        "position": 0.75,
                        "color": NONFINITE_MARKER_COLOR,
                        "anchors": [(0, 0.5), (0, 0.5)],
                    },
                )
                line.setZValue(17)
                self.plot_item.addItem(line, ignoreBounds=True)
                self.first_lines[run.name] = line
            at = float(run_marks.x[rows[0]])
            # The name on the side with room: left of a line in the right half of the run
            # (where runs mostly blow up; on the right it ran off the plot's edge).
            first, last = float(run_marks.x[0]), float(run_marks.x[-1])
            line.label.anchors = (
                [(1, 0.5), (1, 0.5)] if at > (first + last) / 2 else [(0, 0.5), (0, 0.5)]
            )
            line.setValue(at)
            line.label.updatePosition()
        for name in [n for n in self.first_lines if n not in wanted]:
            self.plot_item.removeItem(self.first_lines.pop(name))
        self._points = (np.asarray(x, dtype=np.float64), symbols, data)
        self._skipped_points = (np.asarray(skipped_x, dtype=np.float64), skipped_data)
        self.place()

    def place(self, *_: object) -> None:
        (_, _), (_, top) = self.plot_item.vb.viewRange()
        _, pixel_height = self.plot_item.vb.viewPixelSize()
        # A little under the shown run's markers (8 px from the top): both stay visible.
        y = top - 22 * pixel_height
        x, symbols, data = self._points
        if len(x):
            self.nonfinite.setData(
                x=x, y=np.full(len(x), y), symbol=symbols, pen=self._pen, data=data
            )
        else:
            self.nonfinite.setData([])
        skipped_x, skipped_data = self._skipped_points
        if len(skipped_x):
            self.skipped.setData(x=skipped_x, y=np.full(len(skipped_x), y), data=skipped_data)
        else:
            self.skipped.setData([])

    def clear(self) -> None:
        self.refresh(())
