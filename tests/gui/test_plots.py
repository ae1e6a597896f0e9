"""Plot helpers that must never hide a non-finite value."""

from __future__ import annotations

import numpy as np

from gradscope.core.history import MISSING
from gradscope.gui.plots import log10_display, reduce_steps


def test_log10_display_leaves_nonpositive_and_nonfinite_to_the_markers() -> None:
    values = np.array([100.0, 0.0, np.nan, np.inf, MISSING, 1e-3])
    shown = log10_display(values)
    assert shown[0] == 2 and shown[5] == -3
    assert np.isnan(shown[1:5]).all()


def test_reduce_steps_keeps_every_nonfinite_step() -> None:
    matrix = np.ones((10_001, 3), dtype=np.float32)
    matrix[4567, 0] = np.nan
    matrix[9999, 1] = np.inf
    matrix[:, 2] = MISSING
    matrix[10_000, 2] = 5.0
    reduced, per_row = reduce_steps(matrix, limit=2000)
    assert len(reduced) <= 2000 and per_row == 6
    assert np.isnan(reduced[4567 // per_row, 0])
    assert np.isinf(reduced[9999 // per_row, 1])
    assert reduced[-1, 2] == 5.0 and reduced[0, 2] == MISSING
    assert np.isnan(reduced[:, 0]).sum() == 1


def test_reduce_steps_is_a_no_op_for_short_runs() -> None:
    matrix = np.arange(12, dtype=np.float32).reshape(4, 3)
    reduced, per_row = reduce_steps(matrix)
    assert per_row == 1 and reduced is matrix
