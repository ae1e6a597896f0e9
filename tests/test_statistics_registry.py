"""A detail statistic is one small class and one line of registration
(gradscope.core.watch.statistics): registered, it is read on every detail step, from large
tensors (fused, on a CPU per tensor too) and from stacked small ones alike."""

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
import gradscope.core.watch.statistics as registered
from gradscope.core.watch import figures as tensor_reads
from gradscope.core.watch.statistics import Statistic


class ZeroCount(Statistic):
    """How many elements of each gradient are exactly 0 (dead units), as a test would add
    it: this class and one line in DETAIL."""

    name = "zeros"
    per_layer = "sum"
    scale_power = 0

    def fused(self, grads, params, *, per_tensor, sizes):
        return [(g == 0).sum() for g in grads]

    def stacked(self, grads, params):
        return (torch.stack(grads).reshape(len(grads), -1) == 0).sum(dim=1)


def _model() -> nn.Module:
    torch.manual_seed(0)
    # 40 small Linear(6, 6) layers (stacked: 40 weights and 40 biases of one shape each)
    # between two large ones (fused); the ReLUs leave exact zeros in the gradients.
    small = [m for _ in range(40) for m in (nn.Linear(6, 6), nn.ReLU())]
    return nn.Sequential(nn.Linear(16, 96), nn.ReLU(), nn.Linear(96, 6), *small, nn.Linear(6, 80))


@pytest.mark.parametrize("path", ["per-tensor", "fused"])
def test_a_registered_statistic_is_read_on_detail_steps(monkeypatch, path):
    monkeypatch.setattr(registered, "DETAIL", (*registered.DETAIL, ZeroCount()))
    if path == "fused":
        monkeypatch.setattr(tensor_reads, "PER_TENSOR_DEVICES", ())
    model = _model()
    watch = gradscope.watch(model, detail_every=2)
    assert any(g.stacked for g in watch.binding.groups)
    assert any(not g.stacked for g in watch.binding.groups)
    x = torch.randn(8, 16)
    for step in range(4):
        model.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        stats = watch.collect(loss)
        if step % 2:
            assert "zeros" not in stats.figures  # a plain step reads no detail
            continue
        modules = dict(model.named_modules())
        expected = np.array(
            [
                sum(int((p.grad == 0).sum()) for p in modules[layer.name].parameters())
                for layer in watch.layers
            ]
        )
        assert expected.sum() > 0
        np.testing.assert_array_equal(stats.figures["zeros"], expected)
        # the built-in ones are as before
        reference = [
            max(float(p.grad.abs().max()) for p in modules[layer.name].parameters())
            for layer in watch.layers
        ]
        np.testing.assert_allclose(stats.max_abs, reference, rtol=1e-6)
    watch.close()


def test_the_built_in_statistics_are_registered_in_the_exchange_order():
    assert [s.name for s in registered.DETAIL] == list(registered.BUILT_IN)
