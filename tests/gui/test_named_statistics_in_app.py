"""A named statistic (``StepStats.figures``, a user's ``gradscope.Statistic``) in the app: the
plots' selector offers it under its label, the gradient-norm plot draws it (as points when it
is measured every second step), and ``gradscope open REC --statistic NAME --screenshot PNG``
shoots it from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from PySide6.QtGui import QImage
from torch import nn

import gradscope
from gradscope.core.facts import StatisticInfo
from gradscope.core.module_tree import build_module_tree
from gradscope.core.recording import RecordingWriter

STEPS = 60  # more than the plot's DOTS_UP_TO: a dense statistic is a line, not dots
INFOS = [
    StatisticInfo("grad_rms", "RMS of the gradient", "max", 1, "parameter"),
    StatisticInfo("out_rms", "RMS of the output", "rss", 2, "output"),
]


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))


def record(path: Path) -> dict[str, np.ndarray]:
    """A real run's steps with grad_rms (every step) and out_rms (steps 0, 2, 4...) computed
    with plain torch; returns the expected out_rms, steps x layers (NaN when not due)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    watch = gradscope.watch(model)
    modules = dict(model.named_modules())
    names = [layer.name for layer in watch.layers]
    outputs: dict[str, torch.Tensor] = {}
    hooks = [
        modules[n].register_forward_hook(
            lambda m, a, out, n=n: outputs.__setitem__(n, out.detach())
        )
        for n in names
    ]
    expected = np.full((STEPS, len(names)), np.nan)
    try:
        with RecordingWriter(path, build_module_tree(model)) as writer:
            writer.describe_statistics(INFOS)
            for step in range(STEPS):
                optimizer.zero_grad()
                loss = ((model(torch.randn(8, 5)) - torch.randn(8, 1)) ** 2).mean()
                loss.backward()
                stats = watch.collect(loss)
                stats.figures["grad_rms"] = np.array(
                    [
                        max(float(p.grad.pow(2).mean().sqrt()) for p in modules[n].parameters())
                        for n in names
                    ]
                )
                if step % 2 == 0:
                    expected[step] = [float(outputs[n].pow(2).mean().sqrt()) for n in names]
                    stats.figures["out_rms"] = expected[step].copy()
                writer.append(stats, watch.layers)
                optimizer.step()
    finally:
        for hook in hooks:
            hook.remove()
        watch.close()
    return {"out_rms": expected}


def test_selector_offers_named_statistics_and_draws_the_sparse_one_as_points(
    qtbot, window, tmp_path
) -> None:
    path = tmp_path / "named.gsrec"
    expected = record(path)["out_rms"]
    assert window.recordings.open_recording(path)
    plot = window.plots.gradient_norm
    selector = plot.statistic_selector
    offered = {selector.itemData(i): selector.itemText(i) for i in range(selector.count())}
    assert offered["grad_rms"] == "RMS of the gradient"
    assert offered["out_rms"] == "RMS of the output"
    for other in (window.plots.heatmap, window.plots.flow):
        assert other.statistic_selector.findData("out_rms") >= 0

    with qtbot.waitSignal(plot.statistic_changed, timeout=5000):
        window.plots.show_statistic("out_rms", window.history)
    assert selector.currentText() == "RMS of the output"
    assert "RMS of the output" in plot.widget.plotItem.titleLabel.text
    window._refresh()
    layer = window.history.layer_names[0]
    curve = plot.curves[layer]
    x, y = curve.getData()
    drawn = np.isfinite(y)
    assert x[drawn].tolist() == list(range(0, STEPS, 2))  # the due steps only
    np.testing.assert_allclose(10 ** y[drawn], expected[::2, 0], rtol=1e-5)
    assert curve.opts["symbol"] == "o"  # points: nothing drawn between the due steps

    window.plots.show_statistic("grad_rms", window.history)
    window._refresh()
    assert plot.curves[layer].opts["symbol"] is None  # every step: a line


def _open(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        GRADSCOPE_WINDOW_SIZE="1280x800",
    )
    return subprocess.run(
        [sys.executable, "-m", "gradscope", "open", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_open_statistic_screenshot_shows_the_chosen_statistic(tmp_path) -> None:
    path = tmp_path / "named.gsrec"
    record(path)
    shots = {}
    for name in ("out_rms", "grad_norm"):
        shots[name] = tmp_path / f"{name}.png"
        result = _open([str(path), "--statistic", name, "--screenshot", str(shots[name])], tmp_path)
        assert result.returncode == 0, result.stderr
    images = {name: QImage(str(shot)) for name, shot in shots.items()}
    assert images["out_rms"].width() > 0
    assert images["out_rms"] != images["grad_norm"]  # another statistic drawn
    wrong = _open(
        [str(path), "--statistic", "no_such", "--screenshot", str(tmp_path / "x.png")], tmp_path
    )
    assert wrong.returncode == 2
    assert "no statistic of that name" in wrong.stderr and "out_rms" in wrong.stderr
    assert not (tmp_path / "x.png").exists()
