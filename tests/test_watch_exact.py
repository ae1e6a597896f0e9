"""The watch's one read path is exact on every step: tiny gradients (whose float32 squares
underflow) read their true norms on plain steps as on detail steps, for small tensors (read by
stacking) and large ones (read by a fused norm, then again in float64 when it may have lost
squares). Also the watch's bounded origins and its sinks' closing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.core.facts import STATUS_OK, STATUS_VANISHING
from gradscope.core.watch import binding as binding_module
from gradscope.core.watch import episodes as episodes_module


def _deep_tanh(depth: int = 200, width: int = 8) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


def _reference(model: nn.Module, watch) -> np.ndarray:
    """Per-layer L2 norms of the gradients the watch read, in float64."""
    params = dict(model.named_parameters())
    norms = []
    for layer in watch.layers:
        squares = sum(
            float(params[name].grad.double().square().sum())
            for name in layer.param_names
            if params[name].grad is not None
        )
        norms.append(math.sqrt(squares))
    return np.asarray(norms)


@pytest.mark.parametrize("read", ["stacked", "fused"])
def test_vanishing_gradients_equal_float64_on_every_step(read, monkeypatch):
    if read == "fused":  # every tensor read as a large one: fused norm, then float64
        monkeypatch.setattr(binding_module, "SMALL_NUMEL", 0)
    model = _deep_tanh()
    watch = gradscope.watch(model)  # default: detail every 10th step
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    tiny_seen = 0
    for _ in range(25):
        optimizer.zero_grad()
        x = torch.randn(16, 8, generator=generator)
        loss = model(x).square().mean()
        loss.backward()
        stats = watch.collect(loss)
        expected = _reference(model, watch)
        # float32 squares underflow below ~1e-23: such layers are the point of the test
        tiny_seen += int(((expected > 0) & (expected < 1e-20)).sum())
        zero = expected == 0
        assert not (stats.grad_norm[~zero] == 0).any(), f"step {stats.step}: a tiny layer read 0"
        np.testing.assert_allclose(stats.grad_norm[~zero], expected[~zero], rtol=1e-3)
        assert (stats.grad_norm[zero] == 0).all()
        optimizer.step()
    assert tiny_seen > 100  # the model really vanishes (1e-20 down to 1e-35 and below)


def test_stacked_reads_cover_shapes_in_batches_and_keep_parameter_order(monkeypatch):
    monkeypatch.setattr(binding_module, "STACK_ELEMENTS", 64 * 3)  # three 8x8 weights a batch
    monkeypatch.setattr(binding_module, "STACK_MIN", 1)  # every shape stacked, even one tensor
    torch.manual_seed(0)
    shapes = [(8, 8), (8, 4), (4, 8)] + [(8, 8)] * 5  # interleaved shapes
    model = nn.Sequential(*(nn.Linear(a, b) for a, b in shapes))
    watch = gradscope.watch(model, detail_every=1)
    weights = [g for g in watch.binding.groups if g.stacked and g.params[0].dim() == 2]
    assert sorted(len(g.params) for g in weights) == [1, 1, 3, 3]
    model(torch.randn(4, 8)).sum().backward()
    stats = watch.collect()
    for i, p in enumerate(model.parameters()):
        assert stats.param_grad_norm[i] == pytest.approx(float(p.grad.double().norm()), rel=1e-6)
    for k, layer in enumerate(model):
        expected = max(float(layer.weight.grad.abs().max()), float(layer.bias.grad.abs().max()))
        assert stats.max_abs[k] == expected
        squares = (
            layer.weight.detach().double().square().sum()
            + layer.bias.detach().double().square().sum()
        )
        assert stats.weight_norm[k] == pytest.approx(math.sqrt(float(squares)), rel=1e-6)


def test_origins_are_kept_up_to_a_bound_and_the_rest_counted(monkeypatch):
    monkeypatch.setattr(episodes_module, "ORIGINS_KEPT", 3)
    model = nn.Linear(3, 1)
    watch = gradscope.watch(model)
    for step in range(10):
        model.zero_grad()
        x = torch.ones(2, 3) * (float("nan") if step % 2 else 1.0)
        model(x).sum().backward()
        watch.collect()
    assert [o.step for o in watch.origins] == [1, 3, 5]  # five episodes, three kept
    assert watch.episodes.origins_dropped == 2


class _Sink:
    def __init__(self, log: list, fail: bool = False) -> None:
        self.log, self.fail = log, fail

    def on_step(self, watch, stats) -> None:
        pass

    def close(self) -> None:
        self.log.append(self)
        if self.fail:
            raise OSError("disk full")


def test_close_closes_every_sink_even_when_one_raises():
    log: list = []
    first, second = _Sink(log, fail=True), _Sink(log)
    watch = gradscope.watch(nn.Linear(2, 1), sinks=[first, second])
    with pytest.raises(OSError, match="disk full"):
        watch.close()
    assert log == [first, second]


def _collect_with_gradient_scale(watch, model, scales):
    statuses = []
    for scale in scales:
        model.zero_grad()
        (model(torch.ones(2, 3)).sum() * scale).backward()
        statuses.append(int(watch.collect().status[0]))
    return statuses


def test_vanishing_is_a_state_of_three_consecutive_measured_steps():
    model = nn.Linear(3, 1)
    ok, vanishing = STATUS_OK, STATUS_VANISHING
    # Exactly 0 at the first step only (a fresh model's zero-initialised scale): no alarm.
    watch = gradscope.watch(model)
    assert _collect_with_gradient_scale(watch, model, [0.0, 1.0, 1.0]) == [ok, ok, ok]
    # Under the threshold from the start: vanishing at the third step, and it stays so;
    # one step above it resets the count.
    watch = gradscope.watch(model)
    scales = [1e-12] * 5 + [1.0] + [1e-12] * 3
    expected = [ok, ok, vanishing, vanishing, vanishing, ok, ok, ok, vanishing]
    assert _collect_with_gradient_scale(watch, model, scales) == expected
    # The setting: vanish_steps=1 is the momentary status.
    watch = gradscope.watch(model, vanish_steps=1)
    assert _collect_with_gradient_scale(watch, model, [1e-12, 1.0]) == [vanishing, ok]
    with pytest.raises(Exception, match="vanish_steps must be >= 1"):
        gradscope.watch(model, vanish_steps=0)


def test_a_runner_applies_a_new_vanish_steps_between_steps():
    """The app's "Vanishing after" setting reaches the watch of a run under way: with 1, the
    sigmoid sample's deep layers are vanishing at once, not from the third step."""
    import dataclasses

    from gradscope.core.runner import StepRunner
    from gradscope.core.sources import load_with_settings

    loaded, settings = load_with_settings("sample_models/vanishing_sigmoid_mlp.py", {"steps": 3})
    runner = StepRunner(loaded, settings)
    first = runner.step().stats
    assert first.status[0] == STATUS_OK  # under the threshold for one step only: not yet
    runner.apply_settings(dataclasses.replace(settings, vanish_steps=1))
    assert runner.watch.vanish_steps == 1
    assert runner.step().stats.status[0] == STATUS_VANISHING
