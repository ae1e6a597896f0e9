"""The gradient-norm plot's log10 copy of one statistic of the history, extended step by
step."""

from __future__ import annotations

import numpy as np

from gradscope.core.history import ParameterNorms, RunHistory
from gradscope.gui.mixed_precision import (
    skipped_rows,
)
from gradscope.gui.plots.display_values import log10_display


class LogNormCache:
    """The gradient-norm plot's own copy of log10 ‖grad‖ as drawn (NaN where a marker shows
    the value instead), one contiguous row per history column, extended with the new steps
    only; with the edge points (non-finite or zero) found so far. A history that went back
    (rewound, replaced) is read afresh."""

    def __init__(self, statistic: str = "grad_norm") -> None:
        self.statistic = statistic  # which of the history's per-layer statistics
        self.history: RunHistory | ParameterNorms | None = None
        self.rows = 0
        self.columns = 0
        self.values = np.zeros((0, 0), dtype=np.float32)  # columns x step capacity
        self.steps = np.zeros(0)
        # Where each step is drawn: its number, or with ``wall_clock`` the seconds since
        # the run's first step.
        self.wall_clock = False
        self.x = np.zeros(0)
        self.edge_rows = np.zeros(0, dtype=np.intp)
        self.edge_columns = np.zeros(0, dtype=np.intp)
        self.edge_values = np.zeros(0)
        self.generation = 0  # changes whenever anything above does
        self.resets = 0  # changes when earlier rows were replaced
        self._last: tuple[np.ndarray, int] | None = None

    def _still_valid(self, history: RunHistory | ParameterNorms, matrix: np.ndarray) -> bool:
        if history is not self.history or len(matrix) < self.rows:
            return False
        if not self.rows or self._last is None:
            return True
        row, step = self._last
        return int(history.steps[self.rows - 1]) == step and np.array_equal(
            matrix[self.rows - 1, : len(row)], row, equal_nan=True
        )

    def set_statistic(self, statistic: str) -> None:
        """Hold another statistic from the next update on (read afresh)."""
        if statistic != self.statistic:
            self.statistic = statistic
            self.history = None

    def set_wall_clock(self, wall_clock: bool) -> None:
        """Draw steps at their wall-clock time from the next update on (read afresh)."""
        if wall_clock != self.wall_clock:
            self.wall_clock = wall_clock
            self.history = None

    def update(self, history: RunHistory | ParameterNorms) -> bool:
        """Take the steps added since the last call; True when anything changed."""
        matrix = history.matrix(self.statistic)
        count, columns = matrix.shape
        if not self._still_valid(history, matrix):
            self.history = history
            self.rows = self.columns = 0
            self.edge_rows = np.zeros(0, dtype=np.intp)
            self.edge_columns = np.zeros(0, dtype=np.intp)
            self.edge_values = np.zeros(0)
            self.resets += 1
            self.generation += 1
        if count == self.rows and columns == self.columns:
            return False
        capacity_columns, capacity_rows = self.values.shape
        if columns > capacity_columns or count > capacity_rows:
            grown = np.full(
                (max(columns, capacity_columns), max(count, 2 * capacity_rows, 64)),
                np.nan,
                dtype=np.float32,
            )
            grown[: self.columns, : self.rows] = self.values[: self.columns, : self.rows]
            self.values = grown
            steps = np.zeros(grown.shape[1])
            steps[: self.rows] = self.steps[: self.rows]
            self.steps = steps
            x = np.zeros(grown.shape[1])
            x[: self.rows] = self.x[: self.rows]
            self.x = x
        # Columns added later hold MISSING in earlier rows, i.e. NaN here (the buffer's fill).
        self.values[self.columns : columns, : self.rows] = np.nan
        new = matrix[self.rows : count]
        self.values[:columns, self.rows : count] = log10_display(new).T
        self.steps[self.rows : count] = history.steps[self.rows : count]
        if self.wall_clock:
            self.x[self.rows : count] = history.elapsed_seconds()[self.rows : count]
        else:
            self.x[self.rows : count] = self.steps[self.rows : count]
        # An overflow on a step the loss scaler skipped is expected: no NaN/Inf marker (the
        # skipped step has its own).
        skipped = skipped_rows(history, self.rows, count)[:, None]
        edge_rows, edge_columns = np.nonzero((~np.isfinite(new) & ~skipped) | (new == 0))
        if len(edge_rows):
            self.edge_rows = np.concatenate([self.edge_rows, edge_rows + self.rows])
            self.edge_columns = np.concatenate([self.edge_columns, edge_columns])
            self.edge_values = np.concatenate(
                [self.edge_values, new[edge_rows, edge_columns].astype(np.float64)]
            )
        self.rows, self.columns = count, columns
        if count:
            self._last = (matrix[count - 1].copy(), int(history.steps[count - 1]))
        self.generation += 1
        return True
