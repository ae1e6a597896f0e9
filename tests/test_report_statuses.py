"""The summary table and the JSON report say which status is which: the worst over the run
with the step it was first seen, the last measured step's, nothing for a layer no step
measured, and the finite maximum before a NaN kept beside it. Real watched runs."""

from __future__ import annotations

import math
import re

import torch
from torch import nn

import gradscope
from gradscope.core.history import RunHistory
from gradscope.core.report import build_report, summary_table


def _watched_run(loss_scales: list[float]) -> RunHistory:
    """A small MLP trained one SGD step per scale; the loss is multiplied by the scale
    (1e6: exploding gradients; nan: a NaN loss and gradients)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
    watch = gradscope.watch(model)
    history = RunHistory()
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for step, scale in enumerate(loss_scales):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y) * scale
        loss.backward()
        stats = watch.collect(loss)
        history.append(
            step,
            loss.item(),
            stats,
            [layer.name for layer in watch.layers],
            [layer.type_name for layer in watch.layers],
            [layer.num_params for layer in watch.layers],
        )
        if math.isfinite(loss.item()):
            optimizer.step()
    watch.close()
    return history


def _layer(report: dict, name: str) -> dict:
    return next(layer for layer in report["layers"] if layer["name"] == name)


def test_exploding_at_step_0_only_is_the_worst_status_and_the_last_is_ok():
    history = _watched_run([1e6, 1.0, 1.0])
    layer = _layer(build_report("mlp", "cpu", history), "0")
    assert layer["status"] == "exploding"  # the worst over the run, as before
    assert layer["status_first_seen_step"] == 0
    assert layer["last_status"] == "ok"
    table = summary_table(history)
    header, _, first = table.splitlines()[:3]
    assert "worst status (at step)" in header and "last status" in header
    assert re.search(r"  exploding \(at 0\)\s+ok\s", first), first


def test_a_nan_keeps_the_finite_maximum_before_it():
    history = _watched_run([1.0, 3.0, math.nan])
    report = build_report("mlp", "cpu", history)
    layer = _layer(report, "0")
    assert layer["status"] == layer["last_status"] == "nonfinite"
    assert layer["status_first_seen_step"] == 2
    norms = layer["grad_norm"]
    assert norms[2] == "nan"
    assert layer["finite_max_grad_norm"] == max(norms[:2])
    row = summary_table(history).splitlines()[2]
    assert f"NaN ({max(norms[:2]):.3e} before)" in row


def test_layers_no_step_measured_have_no_status():
    history = RunHistory()
    history.ensure_layers(["0", "2"], ["Linear", "Linear"], [40, 9])  # failed before step 0
    report = build_report("mlp", "cpu", history)
    for layer in report["layers"]:
        assert layer["status"] is None and layer["last_status"] is None
        assert layer["status_first_seen_step"] is None
        assert layer["finite_max_grad_norm"] is None
    rows = summary_table(history).splitlines()[2:]
    assert rows and all("frozen" not in row for row in rows)
    assert all(row.split()[3:5] == ["-", "-"] for row in rows)
