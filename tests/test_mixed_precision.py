"""Mixed precision with a real torch.amp.GradScaler on CPU: the steps the scaler skips are
expected events, not failures; statistics are of the unscaled gradients; a collapsing scale
is a failure."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.recording import RecordingReader
from gradscope.core.watch import STATUS_NONFINITE, STATUS_SKIPPED


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )


def unscaled_norms(model: nn.Module, scale: float) -> list[float]:
    return [float(torch.linalg.vector_norm(p.grad.double())) / scale for p in model.parameters()]


@pytest.mark.parametrize("unscale_first", [False, True])
def test_skipped_steps_are_the_scalers_and_norms_are_unscaled(unscale_first, tmp_path):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # A large initial scale: the first steps overflow and are skipped, as in real fp16 runs.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    watch = gradscope.watch(
        model, scaler=scaler, optimizer=optimizer, record=tmp_path / "amp.gsrec"
    )
    skipped_by_scaler, skipped_by_watch = [], []
    for _ in range(30):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        if unscale_first:
            scaler.unscale_(optimizer)
        expected = unscaled_norms(model, 1.0 if unscale_first else scale)
        stats = watch.collect(loss, locate=lambda x=x, y=y: nn.functional.mse_loss(model(x), y))
        scaler.step(optimizer)
        scaler.update()
        skipped_by_scaler.append(scaler.get_scale() < scale)
        skipped_by_watch.append(stats.skipped)
        assert stats.loss_scale == scale
        assert not stats.nonfinite and stats.origin is None
        if stats.skipped:
            assert (stats.status == STATUS_SKIPPED).any()
            assert not (stats.status == STATUS_NONFINITE).any()
        else:
            np.testing.assert_allclose(stats.param_grad_norm, expected, rtol=1e-5)
            assert (stats.status != STATUS_SKIPPED).all()
    watch.close()
    assert skipped_by_watch == skipped_by_scaler
    assert any(skipped_by_scaler) and not all(skipped_by_scaler)  # both kinds happened
    with RecordingReader(watch.path) as reader:
        _, history = reader.load()
    assert history.skipped[: history.count].tolist() == skipped_by_scaler
    assert history.loss_scale[0] == 2.0**40
    assert history.first_nonfinite is None and not history.events


class SqrtAtZero(nn.Module):
    """Finite forward, infinite gradient: sqrt'(0) = inf in every backward."""

    def forward(self, x):
        return torch.sqrt(torch.relu(x) * 0.0)


def test_a_collapsing_scale_is_a_failure_with_an_origin():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), SqrtAtZero(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    watch = gradscope.watch(model, scaler=scaler, optimizer=optimizer)
    seen = []
    for _ in range(6):
        x = torch.randn(3, 4)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().mean()
        scaler.scale(loss).backward()
        stats = watch.collect(loss, locate=lambda x=x: model(x).float().mean())
        seen.append((stats.loss_scale, stats.skipped, stats.nonfinite))
        scaler.step(optimizer)
        scaler.update()
    # 4, 2, 1: skipped as designed; 0.5: below the collapse threshold (1.0), a failure and
    # so not skipped (a loop that passes over skipped steps must not pass over it).
    assert seen[:3] == [(4.0, True, False), (2.0, True, False), (1.0, True, False)]
    assert seen[3] == (0.5, False, True)
    assert [o.step for o in watch.origins] == [3]
    origin = watch.origins[0]
    assert origin.details["scale_collapse"] == 0.5
    assert origin.phase == "backward" and origin.module == "1"  # the sqrt's backward


AMP_SCRIPT = """
import torch
from torch import nn

class SqrtAtZero(nn.Module):
    def forward(self, x):
        return torch.sqrt(torch.relu(x) * 0.0)

def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), {middle}nn.Linear(16, 1))

def make_batch(batch_size, device):
    return torch.randn(batch_size, 8, device=device), torch.randn(batch_size, 1, device=device)
"""


def test_gradscope_run_amp_healthy_and_collapsing(write_script, tmp_path, capsys):
    healthy = write_script(AMP_SCRIPT.format(middle=""), "healthy.py")
    report = tmp_path / "healthy.json"
    code = main(
        [
            "run",
            str(healthy),
            "--amp",
            "fp16",
            "--steps",
            "4",
            "--fail-on-nonfinite",
            "--json",
            str(report),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, out + err
    data = json.loads(report.read_text())
    assert data["first_nonfinite"] is None and len(data["loss_scale"]) == 4
    assert "loss scaler:" in out

    broken = write_script(AMP_SCRIPT.format(middle="SqrtAtZero(), "), "broken.py")
    report = tmp_path / "broken.json"
    code = main(
        [
            "run",
            str(broken),
            "--amp",
            "fp16",
            "--steps",
            "40",
            "--fail-on-nonfinite",
            "--json",
            str(report),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1, out + err
    data = json.loads(report.read_text())
    origin = data["first_nonfinite"]
    assert origin["module"] == "2" and origin["phase"] == "backward"
    # Every step overflowed: skipped as designed, until the scale collapsed (a failure).
    assert data["skipped_steps"] == list(range(data["steps_run"] - 1))
    assert data["loss_scale"][-1] < 1.0

    bf16 = main(["run", str(healthy), "--amp", "bf16", "--steps", "2"])
    out, _ = capsys.readouterr()
    assert bf16 == 0 and "loss scaler" not in out  # bf16 needs no scaler

