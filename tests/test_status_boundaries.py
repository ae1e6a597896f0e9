"""The edges of a layer's status, measured on real gradients: a norm exactly at the
exploding threshold is not exploding (the threshold is the largest healthy norm), and the
step a report gives for a layer's worst status is the first step it was seen, when it comes
back later."""

from __future__ import annotations

import json

import torch
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.facts import STATUS_EXPLODING, STATUS_OK


def _model_with_gradients() -> tuple[nn.Module, list[str]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    inputs = torch.randn(16, 4)
    model(inputs).square().mean().backward()
    return model, ["0", "2"]


def _statuses(model: nn.Module, explode_threshold: float) -> tuple[list[int], list[float]]:
    with gradscope.watch(model, explode_threshold=explode_threshold, replay=False) as watch:
        stats = watch.collect()
    return stats.status.tolist(), stats.grad_norm.tolist()


def test_a_norm_exactly_at_the_exploding_threshold_is_not_exploding():
    model, _ = _model_with_gradients()
    _, norms = _statuses(model, explode_threshold=1e30)
    assert norms[0] != norms[1]
    low, high = sorted(norms)
    # the same gradients, measured again: the smaller norm is the threshold itself
    status, again = _statuses(model, explode_threshold=low)
    assert again == norms
    assert status == [STATUS_OK if norm == low else STATUS_EXPLODING for norm in norms]
    # every layer at or under it: all ok (the quick path of the common step)
    status, _ = _statuses(model, explode_threshold=high)
    assert status == [STATUS_OK, STATUS_OK]


def test_the_worst_status_is_given_at_the_step_it_was_first_seen(tmp_path, capsys):
    """A layer explodes at steps 2 and 5 (a batch of large inputs), ok in between: the
    report says "exploding (at 2)", in its table and its JSON."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    generator = torch.Generator().manual_seed(1)
    recording = tmp_path / "run.gsrec"
    with gradscope.watch(model, record=recording, explode_threshold=50.0) as watch:
        for step in range(7):
            inputs = torch.randn(16, 4, generator=generator)
            targets = torch.randn(16, 1, generator=generator)
            if step in (2, 5):
                targets = targets * 1000.0  # a batch whose targets are off by far
            model.zero_grad()
            loss = (model(inputs) - targets).square().mean()
            loss.backward()
            stats = watch.collect(loss)
            exploding = stats.status[1] == STATUS_EXPLODING
            assert exploding == (step in (2, 5)), (step, stats.grad_norm)
    capsys.readouterr()
    assert main(["report", str(recording)]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("2 "))
    assert "exploding (at 2)" in row, table
    out = tmp_path / "report.json"
    assert main(["report", str(recording), "--json", str(out)]) == 0
    layers = {layer["name"]: layer for layer in json.loads(out.read_text())["layers"]}
    assert layers["2"]["status_first_seen_step"] == 2
