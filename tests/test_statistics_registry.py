"""A statistic in the batched form (the built-ins' own: fused calls over a group's large
tensors, one stacked batch over its small ones) is one small class: given to the watch, it
is read on its steps from large tensors (fused, on a CPU per tensor too) and from stacked
small ones alike."""

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.core.watch import figures as tensor_reads
from gradscope.core.watch.statistics import BUILT_INS, Statistic


class ZeroCount(Statistic):
    """How many elements of each gradient are exactly 0 (dead units), read in batches."""

    name = "zeros"
    combine = "sum"
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
def test_a_batched_statistic_is_read_on_its_steps(monkeypatch, path):
    if path == "fused":
        monkeypatch.setattr(tensor_reads, "PER_TENSOR_DEVICES", ())
    model = _model()
    watch = gradscope.watch(model, detail_every=2, statistics=[ZeroCount()])
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


def test_the_built_in_statistics_are_listed_in_reading_order():
    assert [s.name for s in BUILT_INS] == [
        "grad_norm",
        "nan_count",
        "inf_count",
        "weight_norm",
        "max_abs",
        "update_ratio",
    ]


def test_a_new_built_in_is_its_module_and_one_line(monkeypatch):
    """Listed beside the built-ins (the one line), a statistic is measured by every watch on
    the watch's detail schedule, in StepStats.figures and statistic_infos, with no other
    edit."""
    from gradscope.core.watch import statistic_set

    monkeypatch.setattr(statistic_set, "BUILT_INS", (*BUILT_INS, ZeroCount()))
    model = _model()
    watch = gradscope.watch(model, detail_every=3)
    assert "zeros" in [info.name for info in watch.statistic_infos]
    x = torch.randn(8, 16)
    for step in range(4):
        model.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        stats = watch.collect(loss)
        assert ("zeros" in stats.figures) == (step % 3 == 0), step
    watch.close()
