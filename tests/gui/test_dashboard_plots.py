"""The plots as a dashboard (issue 27): a statistic selector per plot, several recordings
compared on the same axes, zooming the step axis with y fitted to what is in view, and a
name on each bar of the gradient-flow chart. Real runs of a small MLP, recorded to
.gsrec files, feed the window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

import gradscope
from gradscope.core.history import MISSING

DETAIL_EVERY = 3


def record_run(path: Path, steps: int = 13, seed: int = 0, third_layer: bool = False) -> Path:
    """A real training run of a small MLP written to ``path`` (detail every 3rd step, with
    update ratios); ``third_layer`` adds a layer the other runs do not have."""
    torch.manual_seed(seed)
    modules = [nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)]
    if third_layer:
        modules += [nn.Linear(1, 1)]
    model = nn.Sequential(*modules)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * (seed + 1))
    with gradscope.watch(
        model, record=path, detail_every=DETAIL_EVERY, update_ratio=True, optimizer=optimizer
    ) as watch:
        for _ in range(steps):
            inputs = torch.randn(16, 4)
            loss = nn.functional.mse_loss(model(inputs), inputs.sum(1, keepdim=True))
            loss.backward()
            watch.collect(loss)
            optimizer.step()
            optimizer.zero_grad()
    return path


def _logged(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    out = np.full(values.shape, np.nan)
    good = np.isfinite(values) & (values > 0)
    out[good] = np.log10(values[good])
    return out


def _open(qtbot, window, path: Path) -> None:
    assert window.recordings.open_recording(path)
    window._refresh()


def test_each_plot_shows_the_statistic_its_selector_names(qtbot, window, tmp_path) -> None:
    path = record_run(tmp_path / "run.gsrec")
    _open(qtbot, window, path)
    history = window.history
    plots = window.plots
    layer = "2"
    column = history.column(layer)
    for statistic in ("max_abs", "weight_norm", "update_ratio", "grad_norm"):
        expected = history.matrix(statistic)[:, column]

        plots.gradient_norm.statistic_selector.choose(statistic)
        assert plots.gradient_norm.statistic == statistic
        steps, shown = plots.gradient_norm.curves[layer].getData()
        assert np.array_equal(steps, history.steps)
        assert np.allclose(shown, _logged(expected), equal_nan=True)
        if statistic != "grad_norm":
            # Detail-only: measured on every third step; nothing drawn in between (no
            # invented values), and each value a point (a symbol) of its own.
            measured = expected != MISSING
            assert measured.sum() == len(range(0, history.count, DETAIL_EVERY))
            assert np.isnan(shown[~measured]).all() and np.isfinite(shown[measured]).all()
            assert plots.gradient_norm.curves[layer].opts["symbol"] == "o"

        plots.heatmap.statistic_selector.choose(statistic)
        columns = [history.column(name) for name in plots.heatmap._order]
        assert np.array_equal(
            plots.heatmap._matrix, history.matrix(statistic)[:, columns], equal_nan=True
        )

        plots.flow.statistic_selector.choose(statistic)
        rows = np.flatnonzero((history.matrix(statistic) != MISSING).any(axis=1))
        last = int(rows[-1])
        order = plots.flow._order
        values = history.matrix(statistic)[last, [history.column(n) for n in order]]
        assert plots.flow.step == int(history.steps[last])
        assert np.allclose(plots.flow._values, values)
    # The statistics differ from each other: the selector is not showing one of them.
    assert not np.allclose(history.matrix("max_abs")[0], history.matrix("grad_norm")[0])
