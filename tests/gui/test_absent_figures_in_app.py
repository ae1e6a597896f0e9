"""A statistic that did not apply to a layer (absent, ``StepStats.absent``) draws nothing
there in the app: no point, no NaN marker, no zero marker; the layers it applies to are drawn
as measured. A fresh recording of tests/models/absent_statistics.py's run, and the committed
one (tests/data/absent_figures.gsrec)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from models.absent_statistics import train

DATA = Path(__file__).parents[1] / "data"


@pytest.mark.parametrize("made", ["fresh", "committed"])
def test_an_absent_layer_draws_nothing(qtbot, window, tmp_path, made) -> None:
    path = tmp_path / "absent_figures.gsrec"
    if made == "fresh":
        train(path)
    else:
        shutil.copyfile(DATA / "absent_figures.gsrec", path)
    assert window.recordings.open_recording(path)
    plot = window.plots.gradient_norm
    for name, drawn_steps in (("weight_grad_rms", [0, 1, 2, 3]), ("linear_out_max", [0, 2])):
        with qtbot.waitSignal(plot.statistic_changed, timeout=5000):
            window.plots.show_statistic(name, window.history)
        window._refresh()
        x, y = plot.curves["1"].getData()
        assert not np.isfinite(y).any()  # the LayerNorm: nothing drawn at any step
        for layer in ("0", "3"):
            x, y = plot.curves[layer].getData()
            assert x[np.isfinite(y)].tolist() == drawn_steps
        # and no NaN/Inf or zero marker stands in for the absent values
        assert not [point for point in plot._edge_points if point[0] == "1"]
