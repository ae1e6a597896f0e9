"""The common step's Python path (gradscope.core.watch.plain_step) gives the general numpy
path's statistics bit for bit, is taken on the steps it is meant for, leaves every other step
to the general path, and sees what changes under it: a rebind, a frozen or unfrozen layer, a
new dtype, statuses that change."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.core.facts import STATUS_EXPLODING, STATUS_FROZEN, STATUS_OK
from gradscope.core.watch import figures as tensor_reads
from gradscope.core.watch import gradient_watch as watch_module
from gradscope.core.watch.plain_step import pairwise_sum, sums_match_numpy


@pytest.mark.parametrize("size", [*range(1, 40), 64, 127, 128, 129, 200, 257, 1000, 9000])
def test_pairwise_sum_is_numpys_sum_bit_for_bit(size):
    rng = np.random.default_rng(size)
    data = rng.random(size) * 10.0 ** rng.integers(-12, 12, size)
    values = data.tolist()
    assert pairwise_sum(values, 0, size) == float(np.add.reduce(data))
    for step in (1, 2, 3, 11, 40):
        offsets = np.arange(0, size, step)
        segments = np.add.reduceat(data, offsets).tolist()
        mine = [
            values[o] + pairwise_sum(values, o + 1, min(step, size - o) - 1)
            for o in offsets.tolist()
        ]
        assert mine == segments
    assert sums_match_numpy()


class ThreeParams(nn.Module):
    """A layer of three parameters of its own (a weight, a bias and a gain)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.bias = nn.Parameter(torch.zeros(width))
        self.gain = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight.T + self.bias) * self.gain


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 64, bias=False),  # a layer of one parameter
        nn.LayerNorm(64),
        ThreeParams(64),
        nn.Tanh(),
        nn.Linear(64, 10),
    )


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


def _many_small() -> nn.Module:
    """40 residual blocks of Linear(8, 8): their weights and biases are read by stacking
    (sums of squares in float64), not by the fused norm."""
    torch.manual_seed(0)
    return nn.Sequential(*[Residual(8) for _ in range(40)], nn.Linear(8, 10))


def _same_value(a, b, name: str) -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), name
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b, equal_nan=True), name
    elif isinstance(a, dict) and isinstance(b, dict):  # figures and absent, by name
        assert a.keys() == b.keys(), name
        for key in a:
            _same_value(a[key], b[key], f"{name}[{key!r}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), name
    else:
        assert a == b, name
        assert type(a) is type(b), name


def _same(fast, reference) -> None:
    """Every field of two steps' statistics equal, bit for bit (but the wall time)."""
    for item in dataclasses.fields(fast):
        if item.name != "wall_time":
            _same_value(getattr(fast, item.name), getattr(reference, item.name), item.name)


class Pair:
    """A watch and a reference watch of the same model whose common path is off (the
    general path reads every step), collecting the same gradients; counts the steps the
    first one took by the common path."""

    def __init__(self, model: nn.Module, monkeypatch, **options) -> None:
        self.model = model
        options = {"replay": False, "max_located": 0, **options}
        self.watch = gradscope.watch(model, **options)
        self.reference = gradscope.watch(model, **options)
        self.monkeypatch = monkeypatch
        self.plain = 0
        taken = self.watch._plain_stats

        def counted(transfer):
            found = taken(transfer)
            self.plain += found is not None
            return found

        self.watch._plain_stats = counted

    def collect(self, loss: torch.Tensor):
        stats = self.watch.collect(loss)
        with self.monkeypatch.context() as patch:
            patch.setattr(watch_module, "plan_for", lambda *args: None)
            reference = self.reference.collect(loss)
        _same(stats, reference)
        return stats


def _train(
    pair: Pair,
    steps: int,
    *,
    width: int = 64,
    before_collect=None,
    after_collect=None,
    after_step=None,
    seed: int = 0,
):
    model = pair.model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    found = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        shape = (16, width) if isinstance(width, int) else (16, *width)
        x = torch.randn(shape, generator=generator, dtype=next(model.parameters()).dtype)
        loss = model(x).float().square().mean()
        loss.backward()
        if before_collect is not None:
            before_collect(step)
        found.append(pair.collect(loss))
        if after_collect is not None:
            after_collect(step)
        optimizer.step()
        if after_step is not None:
            after_step(step)
    return found


@pytest.mark.parametrize(("build", "width"), [(_mlp, 64), (_many_small, 8)])
def test_the_common_step_equals_the_general_path_and_is_taken(build, width, monkeypatch):
    pair = Pair(build(), monkeypatch, detail_every=5)
    found = _train(pair, 20, width=width)
    assert all((s.status == STATUS_OK).all() for s in found)
    # Every step but the first (no statuses before it); the detail steps 5, 10 and 15 too.
    assert pair.plain == 19
    assert found[3].max_abs is None and found[5].max_abs is not None
    assert found[3].weight_norm is None and found[5].weight_norm is not None


def test_a_watched_subset_and_a_layer_without_gradient_go_the_general_way(monkeypatch):
    model = _mlp()
    pair = Pair(model, monkeypatch, layers=["0", "2"])
    _train(pair, 6)
    assert pair.plain == 0  # unwatched gradients: the general path's sums
    # Their entries are made anew at each step: no plan is kept for them.
    assert not pair.watch.binding.plain_plans
    pair = Pair(model, monkeypatch)
    model[2].weight.requires_grad_(False)
    found = _train(pair, 4)
    assert found[-1].status[1] == STATUS_FROZEN
    assert pair.plain == 0  # a parameter without a gradient
    model[2].weight.requires_grad_(True)
    found = _train(pair, 6)
    assert (found[-1].status == STATUS_OK).all()
    assert pair.plain > 0


def test_a_status_change_and_its_way_back(monkeypatch):
    pair = Pair(_mlp(), monkeypatch, explode_threshold=50.0, detail_every=100)
    model = pair.model

    def spike(step: int) -> None:
        if step in (4, 5):
            model[0].weight.grad.mul_(1e6)
        if step == 8:
            model[4].gain.grad.fill_(float("nan"))

    def mend(step: int) -> None:  # the NaN is not stepped into the weights
        if step == 8:
            model[4].gain.grad.zero_()

    found = _train(pair, 14, before_collect=spike, after_collect=mend)
    assert found[4].status[0] == STATUS_EXPLODING and found[4].max_abs is not None
    assert found[6].status[0] == STATUS_OK and found[6].max_abs is not None  # changed back
    assert found[8].nonfinite and not found[9].nonfinite
    # Steps 1-3, 7 and 10-13 (the one after a change back, 9, gets the detail).
    assert pair.plain == 8


def test_vanishing_layers_are_counted_by_the_general_path(monkeypatch):
    pair = Pair(_mlp(), monkeypatch, vanish_steps=2, detail_every=100)
    model = pair.model

    def fade(step: int) -> None:
        if 3 <= step < 7:
            model[2].weight.grad.mul_(1e-12)

    found = _train(pair, 12, before_collect=fade)
    assert found[4].status[1] != STATUS_OK and (found[11].status == STATUS_OK).all()
    assert pair.plain >= 4


def test_a_nonfinite_loss_goes_the_general_way(monkeypatch):
    pair = Pair(_mlp(), monkeypatch, detail_every=100)
    _train(pair, 3)
    loss = pair.model(torch.randn(4, 64)).sum()
    loss.backward()
    before = pair.plain
    stats = pair.collect(loss * float("inf"))
    assert stats.loss_nonfinite and pair.plain == before


def test_a_rebind_a_replaced_parameter_and_a_new_dtype_are_seen(monkeypatch):
    model = _mlp()
    pair = Pair(model, monkeypatch, detail_every=100)
    _train(pair, 4)
    first = pair.watch.binding
    assert any(plan is not None for plan in first.plain_plans.values())
    # A replaced parameter: the watch binds again, with plans of its own.
    model[0].weight = nn.Parameter(model[0].weight.detach().clone() * 2)
    pair.reference.rebind()  # the reference binds at its next step too; same figures
    before = pair.plain
    _train(pair, 4, seed=1)
    assert pair.watch.binding is not first and pair.watch.binding.plain_plans
    assert pair.plain > before
    # float64 parameters (the same Parameter objects): figures of float64 gradients.
    model.double()
    before = pair.plain
    found = _train(pair, 4, seed=2)
    assert found[-1].param_grad_norm.dtype == np.float64
    assert pair.plain > before
    # An explicit rebind drops the plans of the old binding.
    pair.watch.rebind()
    assert pair.watch.binding.plain_plans == {}
    _train(pair, 3, seed=3)


# -- the detail step (max |g| and the weights' norms) in Python floats --------------------


def _convnet() -> nn.Module:
    """Stacked groups of small tensors (40 conv weights of 4x4x3x3, their biases, the
    batch norms' weights and biases: each a shape shared by 32 or more), a few large ones,
    and a layer of three parameters."""
    torch.manual_seed(0)
    blocks = []
    for _ in range(40):
        blocks += [nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Tanh()]
    return nn.Sequential(
        *blocks,
        nn.Conv2d(4, 80, 3, padding=1),  # 2,880 elements: fused, read with its own max
        nn.Flatten(),
        nn.Linear(80 * 36, 64),  # large: aminmax on a CPU
        ThreeParams(64),
    )


def _half(dtype):
    def build() -> nn.Module:
        return _mlp().to(dtype)

    build.__name__ = f"_mlp_{dtype}".replace("torch.", "")
    return build


def _wide_mlp() -> nn.Module:
    """Weights above the fused max |g|'s size (4,096 elements): on a CPU each one's max |g|
    comes from an aminmax pair, every parameter's pair side by side."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(72, 72), nn.ReLU(), nn.Linear(72, 72), nn.Tanh(), nn.Linear(72, 72)
    )


LAYOUTS = [(_mlp, 64), (_wide_mlp, 72), (_many_small, 8), (_convnet, (4, 6, 6))]


@pytest.mark.parametrize("per_tensor", [True, False], ids=["aminmax", "fused"])
@pytest.mark.parametrize(
    ("build", "width"),
    [*LAYOUTS, (_half(torch.float16), 64), (_half(torch.bfloat16), 64)],
    ids=["mlp", "wide_mlp", "many_small", "convnet", "float16", "bfloat16"],
)
def test_the_detail_step_equals_the_general_path_and_is_taken(
    build, width, per_tensor, monkeypatch
):
    if not per_tensor:  # max |g| of large tensors by the fused ord-inf norm, as on CUDA
        monkeypatch.setattr(tensor_reads, "PER_TENSOR_DEVICES", ())
    pair = Pair(build(), monkeypatch, detail_every=1)
    found = _train(pair, 8, width=width)
    assert all((s.status == STATUS_OK).all() for s in found)
    assert all(s.max_abs is not None and s.weight_norm is not None for s in found)
    assert pair.plain == 7  # every step but the first
    # The weights' last figures, kept between steps, are the general path's too.
    kept = pair.watch.kept_figures["weight_norm"]
    assert np.array_equal(kept, pair.reference.kept_figures["weight_norm"])
    assert kept is pair.watch.weight_norm


def test_the_update_ratio_of_a_detail_step_is_the_general_paths(monkeypatch):
    pair = Pair(_convnet(), monkeypatch, detail_every=2, update_ratio=True)
    ratios = []

    def measure(step: int) -> None:
        mine, theirs = pair.watch.measure_update(), pair.reference.measure_update()
        if step % 2 == 0:
            assert mine is not None and np.array_equal(mine, theirs)
            ratios.append(mine)

    _train(pair, 6, width=(4, 6, 6), after_step=measure)
    assert pair.plain == 5 and len(ratios) == 3


def test_a_frozen_layer_and_a_parameter_without_gradient_take_the_general_detail(monkeypatch):
    model = _convnet()
    pair = Pair(model, monkeypatch, detail_every=1)
    model[3].requires_grad_(False)  # a frozen conv of stacked groups
    model[-2].bias.requires_grad_(False)  # a layer with some parameters frozen
    found = _train(pair, 4, width=(4, 6, 6))
    assert found[-1].status[2] == STATUS_FROZEN and found[-1].status[-2] == STATUS_OK
    assert pair.plain == 0
    model[3].requires_grad_(True)
    model[-2].bias.requires_grad_(True)
    found = _train(pair, 4, width=(4, 6, 6), seed=1)
    assert (found[-1].status == STATUS_OK).all() and pair.plain == 3


def test_a_tiny_max_abs_takes_the_general_detail(monkeypatch):
    """A float32 gradient whose elements all lie below 1e-15 in a layer that is not
    vanishing: its fused norm may have lost squares, and the general path reads it again
    exactly; the common path must leave that step to it."""
    pair = Pair(_mlp(), monkeypatch, detail_every=1)
    model = pair.model

    def shrink(step: int) -> None:
        if step in (3, 4):
            model[0].bias.grad.mul_(1e-24)

    found = _train(pair, 7, before_collect=shrink)
    assert (found[3].status == STATUS_OK).all()
    assert 0 < found[3].max_abs[0] and found[3].param_grad_norm[1] < 1e-15
    assert pair.plain == 4  # steps 1, 2, 5 and 6


def test_a_status_change_a_nan_and_a_user_statistic_take_the_general_detail(monkeypatch):
    class GradMean(gradscope.Statistic):
        name = "grad_mean"
        label = "Mean gradient"
        combine = "mean"
        every = 3

        def parameter(self, grad, weight):
            return grad.mean()

    pair = Pair(_mlp(), monkeypatch, detail_every=1, explode_threshold=50.0)
    pair.watch.statistics = pair.watch.read_setup.statistics = watch_module.StatisticSet(
        [GradMean()]
    )
    pair.reference.statistics = pair.reference.read_setup.statistics = watch_module.StatisticSet(
        [GradMean()]
    )
    model = pair.model

    def spoil(step: int) -> None:
        if step == 4:
            model[0].weight.grad.mul_(1e6)  # exploding at 4, back to ok at 5
        if step == 8:
            model[4].gain.grad[0] = float("nan")

    def mend(step: int) -> None:
        if step == 8:
            model[4].gain.grad.zero_()

    found = _train(pair, 11, before_collect=spoil, after_collect=mend)
    assert found[4].status[0] == STATUS_EXPLODING and found[8].nonfinite
    assert all("grad_mean" in found[k].figures for k in (0, 3, 6, 9))
    assert "grad_mean" not in found[7].figures and found[7].max_abs is not None
    # Not 0 (first), 3, 6, 9 (the user's statistic), 4, 5 (status change and back), 8 (NaN)
    # and 9 (after it): steps 1, 2, 7 and 10.
    assert pair.plain == 4
