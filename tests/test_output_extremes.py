"""The output max |x| read by its extremes (one reduction per module call, one combine per
step): the same figures as ``abs().amax()`` per module, for a module called twice in a step,
an output changed in place afterwards, float16 outputs and a non-finite one."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import gradscope


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.shared = nn.Linear(8, 8)
        self.low = nn.Linear(8, 8).half()
        self.act = nn.ReLU(inplace=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # called twice, the second output smaller
        hidden = self.shared(self.shared(self.inp(x)) * 0.01)
        hidden = self.act(hidden)  # in place: the output read above is changed after
        return self.out(self.low(hidden.half()).float())


def _expected(model: _Shared, x: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        first = model.inp(x)
        once = model.shared(first)
        twice = model.shared(once * 0.01)
        act = twice.clamp(min=0)
        half = model.low(act.half())
        out = model.out(half.float())
    figure = lambda t: t.abs().max().item()  # noqa: E731
    return {
        "inp": figure(first),
        "shared": max(figure(once), figure(twice)),
        "low": figure(half),
        "out": figure(out),
    }


def test_output_max_abs_by_extremes_matches_abs_amax_per_module():
    torch.manual_seed(0)
    model = _Shared()
    x = torch.randn(5, 6)
    with gradscope.watch(model, early_warnings=True, detail_every=1) as watch:
        expected = _expected(model, x)
        loss = model(x).square().mean()
        loss.backward()
        stats = watch.collect(loss)
    names = [layer.name for layer in watch.layers]
    figures = dict(zip(names, stats.figures["out_max_abs"].tolist(), strict=True))
    assert figures == pytest.approx(expected, rel=1e-6)
    dtypes = watch._output_max_abs.dtypes
    assert dtypes[id(model.low)] == torch.float16


def test_a_non_finite_output_gives_a_non_finite_max_abs():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    with torch.no_grad():
        model[0].weight[0, 0] = math.inf
    with gradscope.watch(model, early_warnings=True, detail_every=1) as watch:
        loss = model(torch.ones(2, 3)).sum()
        loss.backward()
        stats = watch.collect(loss)
    assert not math.isfinite(stats.figures["out_max_abs"][0])
