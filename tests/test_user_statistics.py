"""The public statistics protocol (issue #36): ``GradRMS`` and ``OutRMS`` exactly as the
README's example writes them, measured against plain torch on the steps they are due and
absent on the others; forward hooks only on due steps; a statistic that fails is turned off
with one warning while training goes on; the built-ins are statistics like any other."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from models.issue_statistics import GradRMS, OutRMS
from torch import nn

import gradscope
from gradscope.core.errors import GradScopeError
from gradscope.core.facts import StatisticInfo
from gradscope.core.watch import figures as tensor_reads
from gradscope.core.watch.statistics import BUILT_INS, MaxAbs


def _model() -> nn.Module:
    torch.manual_seed(0)
    # Two large layers (read by fused calls) around 40 small Linear(6, 6) (stacked: 40
    # weights and 40 biases of one shape each), so both kinds of group are read.
    small = [m for _ in range(40) for m in (nn.Linear(6, 6), nn.Tanh())]
    return nn.Sequential(nn.Linear(16, 96), nn.ReLU(), nn.Linear(96, 6), *small, nn.Linear(6, 80))


def _outputs_by_plain_torch(model: nn.Sequential, x: torch.Tensor) -> dict[str, torch.Tensor]:
    outputs = {}
    with torch.no_grad():
        for name, module in model.named_children():
            x = module(x)
            outputs[name] = x
    return outputs


@pytest.mark.parametrize("path", ["per-tensor", "fused"])
def test_grad_rms_and_out_rms_match_plain_torch_on_due_steps_only(monkeypatch, path):
    if path == "fused":
        monkeypatch.setattr(tensor_reads, "PER_TENSOR_DEVICES", ())
    model = _model()
    watch = gradscope.watch(model, statistics=[GradRMS(), OutRMS()], detail_every=3)
    assert any(g.stacked for g in watch.binding.groups)
    assert any(not g.stacked for g in watch.binding.groups)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    modules = dict(model.named_modules())
    for step in range(5):
        x = torch.randn(8, 16)
        expected_out = _outputs_by_plain_torch(model, x)
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        stats = watch.collect(loss)
        rms = [
            max(
                float(p.grad.double().square().mean().sqrt())
                for p in modules[layer.name].parameters()
            )
            for layer in watch.layers
        ]
        np.testing.assert_allclose(stats.figures["grad_rms"], rms, rtol=1e-5)
        if step % 2:
            assert "out_rms" not in stats.figures
        else:
            out = [
                float(expected_out[layer.name].double().square().mean().sqrt())
                for layer in watch.layers
            ]
            np.testing.assert_allclose(stats.figures["out_rms"], out, rtol=1e-5)
        # The built-ins keep their fields and their schedule (detail_every=3; this deep
        # Tanh stack turns vanishing, and a step that changes a status reads them too:
        # never the user's statistics off their schedule, as above).
        if step % 3 == 0:
            assert stats.max_abs is not None
        assert "max_abs" not in stats.figures
        optimizer.step()
    watch.close()


def test_the_output_hooks_are_there_only_before_a_due_step():
    model = _model()
    watched = [m for m in model.modules() if isinstance(m, nn.Linear)]
    before = [len(m._forward_hooks) for m in watched]
    watch = gradscope.watch(model, statistics=[OutRMS()])
    x = torch.randn(4, 16)
    for step in range(5):
        due = step % OutRMS.every == 0
        hooks = [len(m._forward_hooks) - n for m, n in zip(watched, before, strict=True)]
        assert hooks == [1 if due else 0] * len(watched), step
        model.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        watch.collect(loss)
    watch.close()
    assert [len(m._forward_hooks) for m in watched] == before
    # Without a forward statistic no module is hooked at all.
    plain = gradscope.watch(model, statistics=[GradRMS()])
    assert [len(m._forward_hooks) for m in watched] == before
    plain.close()


class Raises(gradscope.Statistic):
    name = "raises"
    every = 1

    def parameter(self, grad, weight):
        raise RuntimeError("broken on purpose")


class NotATensor(gradscope.Statistic):
    name = "not_a_tensor"
    every = 1

    def parameter(self, grad, weight):
        return 1.5


class WrongShape(gradscope.Statistic):
    name = "wrong_shape"
    every = 1

    def parameter(self, grad, weight):
        return grad.float().abs().sum(dim=-1)


class OutputRaises(gradscope.Statistic):
    name = "output_raises"
    every = 1

    def output(self, module, output):
        raise ValueError("no output today")


def test_a_failing_statistic_is_turned_off_with_one_warning_and_training_goes_on():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    broken = [Raises(), NotATensor(), WrongShape(), OutputRaises()]
    watch = gradscope.watch(model, statistics=[*broken, GradRMS()], detail_every=1)
    x = torch.randn(8, 16)
    weights = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            optimizer.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            stats = watch.collect(loss)
            optimizer.step()
            weights.append(model[-1].weight.detach().clone())
            assert set(stats.figures) == {"grad_rms"}
            assert stats.max_abs is not None and np.isfinite(stats.grad_norm).all()
    told = [str(w.message) for w in caught if "statistic" in str(w.message)]
    assert len(told) == len(broken), told
    for statistic in broken:
        (message,) = [m for m in told if repr(statistic.name) in m]
        assert "turned off" in message
    assert "broken on purpose" in " ".join(told) and "not a tensor" in " ".join(told)
    assert not torch.equal(weights[0], weights[-1])  # the optimizer kept training
    names = [info.name for info in watch.statistic_infos]
    assert "grad_rms" in names and not set(names) & {s.name for s in broken}
    # the failing forward statistic's hooks are gone with it
    assert all(not m._forward_hooks for m in model.modules())
    watch.close()


def test_the_built_ins_are_statistics_like_any_other(monkeypatch):
    assert all(isinstance(s, gradscope.Statistic) for s in BUILT_INS)
    model = _model()
    watch = gradscope.watch(
        model,
        statistics=[GradRMS(), OutRMS()],
        detail_every=2,
        update_ratio=True,
    )
    infos = {info.name: info for info in watch.statistic_infos}
    assert list(infos)[:6] == [
        "grad_norm",
        "nan_count",
        "inf_count",
        "weight_norm",
        "max_abs",
        "update_ratio",
    ]
    assert infos["grad_norm"] == StatisticInfo("grad_norm", "Gradient norm", "rss", 1)
    assert infos["max_abs"].every == 2 and infos["max_abs"].combine == "max"
    assert infos["grad_rms"] == StatisticInfo("grad_rms", "RMS of the gradient", "max", 1)
    assert infos["out_rms"] == StatisticInfo("out_rms", "", "rss", 2, "output")
    watch.close()
    # A built-in's schedule is its own: max |g| every 3rd step, the weights' every 2nd.
    monkeypatch.setattr(MaxAbs, "every", 3)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))  # stays ok
    watch = gradscope.watch(model, detail_every=2)
    x = torch.randn(4, 16)
    for step in range(7):
        model.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        stats = watch.collect(loss)
        assert (stats.max_abs is not None) == (step % 3 == 0), step
        assert (stats.weight_norm is not None) == (step % 2 == 0), step
    watch.close()


class Mean(gradscope.Statistic):
    name = "mean_abs"
    combine = "mean"
    every = 1
    scale_power = 1

    def parameter(self, grad, weight):
        return grad.abs().mean()


class Count(gradscope.Statistic):
    name = "elements"
    combine = "sum"
    every = 1

    def parameter(self, grad, weight):
        return torch.tensor(grad.numel(), device=grad.device)


def test_combine_mean_and_sum_and_a_layer_without_gradient():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3), nn.Linear(3, 2))
    model[3].requires_grad_(False)
    watch = gradscope.watch(model, statistics=[Mean(), Count()])
    loss = model(torch.randn(6, 5)).sum()
    loss.backward()
    stats = watch.collect(loss)
    for index, layer in enumerate(watch.layers[:2]):
        module = dict(model.named_modules())[layer.name]
        means = [float(p.grad.abs().mean()) for p in module.parameters()]
        assert stats.figures["mean_abs"][index] == pytest.approx(np.mean(means), rel=1e-6)
        assert stats.figures["elements"][index] == sum(p.numel() for p in module.parameters())
    assert stats.figures["mean_abs"][2] == 0 and stats.figures["elements"][2] == 0
    watch.close()


@pytest.mark.parametrize(
    ("statistic", "says"),
    [
        (GradRMS, "is a class"),
        (object(), "not a gradscope.Statistic"),
        (type("NoName", (gradscope.Statistic,), {"parameter": GradRMS.parameter})(), "no name"),
        (type("Odd", (GradRMS,), {"combine": "median"})(), "combine"),
        (type("Odd", (GradRMS,), {"name": "grad/rms"})(), "letters, digits"),
        (type("Odd", (GradRMS,), {"every": 0})(), "every"),
        (type("Odd", (GradRMS,), {"name": "grad_norm"})(), "two statistics"),
        (type("Odd", (GradRMS,), {"name": "status"})(), "taken by the reports"),
        (type("Empty", (gradscope.Statistic,), {"name": "empty"})(), "neither"),
    ],
)
def test_a_statistic_the_watch_cannot_measure_is_refused_with_a_clear_message(statistic, says):
    with pytest.raises(GradScopeError, match=says):
        gradscope.watch(nn.Linear(2, 2), statistics=[statistic])
