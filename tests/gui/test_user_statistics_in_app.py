"""``GradRMS`` and ``OutRMS`` exactly as the README's example of ``gradscope.Statistic``
(issue #36), recorded by a real watch, in the app: the selector offers them under their
labels, the chosen one is drawn with plain torch's values, and ``gradscope open REC
--statistic NAME --screenshot PNG`` shoots it. Skipped where the protocol is absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from models.issue_statistics import GradRMS, OutRMS
from PySide6.QtGui import QImage
from torch import nn

import gradscope

STEPS = 50  # more than the plot's DOTS_UP_TO: only a sparse statistic is drawn as dots


def _record(path: Path) -> np.ndarray:
    """The run's out_rms of the first layer at every step, from plain torch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    outputs = []
    hook = model[0].register_forward_hook(lambda m, a, out: outputs.append(out.detach()))
    with gradscope.watch(model, statistics=[GradRMS(), OutRMS()], record=path) as watch:
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = ((model(torch.randn(8, 5)) - torch.randn(8, 1)) ** 2).mean()
            loss.backward()
            watch.collect(loss)
            optimizer.step()
    hook.remove()
    return np.array([float(out.pow(2).mean().sqrt()) for out in outputs])


def test_the_selector_offers_user_statistics_and_draws_them(qtbot, window, tmp_path) -> None:
    path = tmp_path / "user.gsrec"
    out_rms = _record(path)
    assert window.recordings.open_recording(path)
    plot = window.plots.gradient_norm
    selector = plot.statistic_selector
    offered = {selector.itemData(i): selector.itemText(i) for i in range(selector.count())}
    assert offered["grad_rms"] == "RMS of the gradient" and offered["out_rms"] == "out_rms"
    window.plots.show_statistic("out_rms", window.history)
    window._refresh()
    x, y = plot.curves["0"].getData()
    drawn = np.isfinite(y)
    assert x[drawn].tolist() == list(range(0, STEPS, 2))
    np.testing.assert_allclose(10 ** y[drawn], out_rms[::2], rtol=1e-5)
    assert plot.curves["0"].opts["symbol"] == "o"


def test_open_statistic_screenshot_of_a_user_statistic(tmp_path) -> None:
    path = tmp_path / "user.gsrec"
    _record(path)
    shot = tmp_path / "shot.png"
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        GRADSCOPE_WINDOW_SIZE="1280x800",
    )
    command = [sys.executable, "-m", "gradscope", "open", str(path), "--statistic", "grad_rms"]
    result = subprocess.run(
        [*command, "--screenshot", str(shot)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert QImage(str(shot)).width() == 1280
