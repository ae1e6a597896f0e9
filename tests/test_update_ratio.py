"""The update ratio ||Δw||/||w|| against an independent computation: the weights copied
before each optimizer step and after it, the norms taken here in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.core.loading import LoadedModel
from gradscope.core.runner import StepRunner
from gradscope.core.settings import RunSettings


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16, bias=False), nn.LayerNorm(16),
        nn.Linear(16, 2),
    )  # fmt: skip


def _expected(before: dict[str, torch.Tensor], model: nn.Module, layers) -> np.ndarray:
    """Per layer: the norm of the change of all its parameters over the norm of all of them
    before the step."""
    after = {name: p.detach().double() for name, p in model.named_parameters()}
    ratios = []
    for layer in layers:
        delta = sum(float((after[n] - before[n]).square().sum()) for n in layer.param_names)
        weight = sum(float(before[n].square().sum()) for n in layer.param_names)
        ratios.append(np.sqrt(delta) / np.sqrt(weight))
    return np.array(ratios)


def _copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().double().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    "settings",
    [
        {"optimizer": "sgd", "lr": 0.3, "momentum": 0.9},
        {"optimizer": "adam", "lr": 0.05, "weight_decay": 0.1},
        {"optimizer": "sgd", "lr": 0.5, "clip": 0.01},
    ],
)
def test_runner_update_ratio_is_the_weights_change(settings):
    def make_batch(batch_size, device):
        return torch.randn(batch_size, 6, device=device), torch.randn(batch_size, 2, device=device)

    loaded = LoadedModel("test", "test", _model, make_batch, None)
    run_settings = RunSettings(device="cpu", steps=4, update_ratio=True, **settings)
    runner = StepRunner(loaded, run_settings)
    layers = runner.watch.layers
    assert {len(layer.param_names) for layer in layers} == {1, 2}  # weight alone and with bias
    for _ in range(4):
        before = _copy(runner.model)
        result = runner.step()
        expected = _expected(before, runner.model, layers)
        assert (expected > 1e-4).all()  # a real change, not rounding
        np.testing.assert_allclose(result.stats.update_ratio, expected, rtol=1e-5)


def test_watch_api_update_ratio_with_an_optimizer_hook():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    with gradscope.watch(model, update_ratio=True, optimizer=optimizer, detail_every=1) as watch:
        for _ in range(3):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(torch.randn(8, 6)), torch.randn(8, 2))
            loss.backward()
            stats = watch.collect(loss)
            before = _copy(model)
            optimizer.step()  # the hook measures the ratio
            expected = _expected(before, model, watch.layers)
            np.testing.assert_allclose(stats.update_ratio, expected, rtol=1e-5)
