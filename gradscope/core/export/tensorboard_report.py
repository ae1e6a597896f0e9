"""A recording converted to TensorBoard events (``gradscope report REC --tensorboard DIR``):
the same tags, steps and values the live sink writes (see :mod:`.scalars`)."""

from __future__ import annotations

import os

import numpy as np

from gradscope.core.export.scalars import (
    FIRST_ORIGIN_TAG,
    layer_tag,
    origin_summary,
    step_scalars,
    warning_summary,
    warning_tag,
)
from gradscope.core.export.tensorboard_events import TensorBoardEvents
from gradscope.core.facts import STATUS_NONFINITE
from gradscope.core.history import MISSING, STATISTICS, STATUS_MISSING, RunHistory


def write_tensorboard(history: RunHistory, logdir: str | os.PathLike[str]) -> int:
    """Write every step of ``history`` to ``logdir``; returns the number of steps written.
    A layer's cells of steps it was not watched at, and statistics a step did not measure,
    are left out (never written as a value)."""
    events = TensorBoardEvents(logdir)
    try:
        names = list(history.layer_names)
        status = history.status_matrix()
        matrices = {statistic: history.matrix(statistic) for statistic in STATISTICS}
        # Named statistics: by the steps they were due at (their values may be negative), a
        # value for every layer watched at such a step.
        named = {
            name: (history.matrix(name), history.figure_due(name), history.figure_absent(name))
            for name in history.figure_names
        }
        steps = history.steps.tolist()
        totals = history.total_grad_norm[: history.count].tolist()
        for row, step in enumerate(steps):
            watched = status[row] != STATUS_MISSING
            statistics: dict[str, np.ndarray | None] = {}
            for statistic, matrix in matrices.items():
                values = matrix[row]
                measured = watched & (values != MISSING)
                # A step either measured a statistic for all its watched layers or none.
                statistics[statistic] = values if measured.any() else None
            built_in = dict(statistics)
            for statistic, (matrix, due, _) in named.items():
                statistics[statistic] = matrix[row] if due[row] else None
            scalars = step_scalars(
                names, totals[row], statistics, status[row] == STATUS_NONFINITE, watched
            )
            for statistic, (_, due, absent) in named.items():
                if absent is not None and due[row]:  # not applicable there: no point
                    for column in np.flatnonzero(absent[row]).tolist():
                        scalars.pop(layer_tag(statistic, names[column]), None)
            for statistic, values in built_in.items():
                if values is not None:
                    for column in np.flatnonzero(watched & (values == MISSING)).tolist():
                        scalars.pop(layer_tag(statistic, names[column]), None)
            events.scalars(step, scalars)
        first = history.first_nonfinite
        if first is not None:
            events.text(first.step, FIRST_ORIGIN_TAG, origin_summary(first))
        for warning in history.warnings:
            events.text(warning.step, warning_tag(warning), warning_summary(warning))
    finally:
        events.close()
    return len(steps)
