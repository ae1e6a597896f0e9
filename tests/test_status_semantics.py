"""Statuses that do not cry wolf (issue 25). The watch side is the lead's, in the new watch
package: "vanishing" only after 3 consecutive measured steps under the threshold, "skipped"
only for the loss scaler's own overflow (a non-finite loss or batch is "nonfinite", never
"skipped"), and no status for a layer no step measured. The sample tests are guards that
the change keeps the real alarms."""

from __future__ import annotations

import json

import numpy as np
import torch
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.watch import STATUS_NONFINITE, STATUS_SKIPPED, STATUS_VANISHING

ALARMS = ("vanishing", "exploding", "nonfinite")


def _run(argv: list[str], tmp_path) -> dict:
    out = tmp_path / "report.json"
    code = main(["run", *argv, "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0, report.get("error")
    return report


def test_timm_resnet18_fresh_runs_clean(tmp_path):
    """timm zero-initialises each block's last BN weight: the gradients upstream of it are
    exactly 0 at step 0 only. That is no alarm, at any step, in worst or last status."""
    report = _run(
        ["timm:resnet18", "--steps", "3", "--image-size", "64", "--batch-size", "2"], tmp_path
    )
    alarmed = {
        layer["name"]: (layer["status"], layer["last_status"])
        for layer in report["layers"]
        if layer["status"] in ALARMS or layer["last_status"] in ALARMS
    }
    assert not alarmed


def _zero_gradient_steps(zero_steps: int, total: int) -> list[np.ndarray]:
    """A Linear whose output is multiplied by a scale that is 0 for the first
    ``zero_steps`` steps (a zero-initialised layer scale), then 1: its gradient is exactly
    0 while the scale is."""
    torch.manual_seed(0)
    lin, scale = nn.Linear(4, 4), nn.Parameter(torch.zeros(()))
    model = nn.ModuleDict({"lin": lin})
    watch = gradscope.watch(model)
    column = [layer.name for layer in watch.layers].index("lin")
    statuses = []
    for step in range(total):
        with torch.no_grad():
            scale.fill_(0.0 if step < zero_steps else 1.0)
        loss = (model["lin"](torch.randn(8, 4)) * scale).sum()
        lin.zero_grad()
        loss.backward()
        statuses.append(watch.collect(loss).status[column])
    watch.close()
    return statuses


def test_an_exact_zero_gradient_on_the_first_two_steps_is_not_vanishing():
    assert STATUS_VANISHING not in _zero_gradient_steps(zero_steps=2, total=4)


def test_a_gradient_under_the_threshold_for_three_steps_is_vanishing():
    assert _zero_gradient_steps(zero_steps=5, total=5)[2:] == [STATUS_VANISHING] * 3


def test_a_nan_batch_under_a_grad_scaler_is_nonfinite_not_skipped():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    watch = gradscope.watch(model, scaler=scaler, optimizer=optimizer)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    x[3, 2] = float("nan")  # bad data, not an overflow of the scaled gradients
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    stats = watch.collect(loss, locate=lambda: nn.functional.mse_loss(model(x), y))
    scaler.step(optimizer)
    scaler.update()
    watch.close()
    assert (stats.nonfinite, stats.skipped) == (True, False)
    assert (stats.status == STATUS_NONFINITE).any()
    assert not (stats.status == STATUS_SKIPPED).any()
    assert stats.origin is not None and stats.origin.phase == "input"


def test_seed_explosion_still_explodes_at_step_0(tmp_path):
    report = _run(["sample_models/seed_explosion.py", "--steps", "3"], tmp_path)
    layer = next(la for la in report["layers"] if la["name"] == "critical_layer")
    assert layer["status"] == "exploding" and layer["status_first_seen_step"] == 0


def test_vanishing_sigmoid_mlp_still_vanishes(tmp_path):
    report = _run(["sample_models/vanishing_sigmoid_mlp.py", "--steps", "5"], tmp_path)
    layer = next(la for la in report["layers"] if la["name"] == "hidden.0")
    assert layer["status"] == layer["last_status"] == "vanishing"


def test_the_watchs_own_nonfinite_verdict_matches_the_fields():
    """StepStats.known_nonfinite (the watch's verdict, kept so that sinks and the episode
    check do not look at the statuses again) says what the fields say, on finite steps, a
    NaN gradient, a NaN loss, an Inf in an unwatched layer, and a step after them."""
    import dataclasses

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    watch = gradscope.watch(model, layers=["0"])
    seen = []
    for case in ("finite", "nan grad", "nan loss", "unwatched inf", "finite"):
        model.zero_grad()
        loss = model(torch.randn(3, 4)).square().mean()
        loss.backward()
        if case == "nan grad":
            model[0].weight.grad[0, 0] = float("nan")
        if case == "unwatched inf":
            model[2].bias.grad[0] = float("inf")
        stats = watch.collect(loss * float("nan") if case == "nan loss" else loss)
        worked_out = dataclasses.replace(stats, known_nonfinite=None).nonfinite
        assert stats.known_nonfinite is worked_out
        seen.append(worked_out)
    watch.close()
    assert seen == [False, True, True, True, False]
