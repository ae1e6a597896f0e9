"""The watch's statistics against plain PyTorch, so speed work on the engine cannot quietly
break them: per-parameter and per-layer norms, max |g|, weight norms, NaN/Inf counts and
status, half-precision gradients, layer subsets and parameters without gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from gradscope.core.watch import (
    STATUS_EXPLODING,
    STATUS_NAMES,
    STATUS_NO_GRADIENT,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_VANISHING,
    GradientWatch,
)
from gradscope.core.watch import binding as binding_module
from gradscope.core.watch import figures as figures_module


@pytest.fixture(autouse=True, params=["per-tensor", "fused", "unstacked"])
def engine_path(request, monkeypatch):
    """Every test runs each way the engine computes statistics: small tensors stacked per
    shape and large ones' max |g| by aminmax per tensor (the CPU path); fused
    ``_foreach_norm`` calls for the large ones (the CUDA path), forced onto CPU here so that
    it is checked without a GPU; and no tensor stacked (every one read as a large one)."""
    if request.param == "per-tensor":  # every small tensor stacked, however few share a shape
        monkeypatch.setattr(binding_module, "STACK_MIN", 1)
    if request.param == "fused":
        monkeypatch.setattr(figures_module, "PER_TENSOR_DEVICES", ())
    if request.param == "unstacked":
        monkeypatch.setattr(binding_module, "SMALL_NUMEL", 0)
    return request.param


class Net(nn.Module):
    """A small real model: conv, batch norm, linear layers, a parameterless module, a
    container with its own parameter, and a layer that the forward pass never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.Conv2d(6, 4, 3, stride=2, bias=False),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 3 * 3, 16), nn.Tanh())
        self.out = nn.Linear(16, 5)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.unused = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.head(self.features(x))) * self.scale


def _backward(model: nn.Module, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, 8, 8, generator=gen)
    y = torch.randint(0, 5, (4,), generator=gen)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


def _model() -> Net:
    torch.manual_seed(0)
    return Net()


def _layer_params(model: nn.Module, watch: GradientWatch) -> dict[str, list[nn.Parameter]]:
    params = dict(model.named_parameters())
    return {layer.name: [params[n] for n in layer.param_names] for layer in watch.layers}


def _expected(model: nn.Module, watch: GradientWatch) -> dict[str, np.ndarray]:
    """Per-layer statistics computed independently, in float64, from plain PyTorch."""
    out: dict[str, list[float]] = {k: [] for k in ("grad_norm", "max_abs", "weight_norm")}
    for params in _layer_params(model, watch).values():
        grads = [p.grad.double() for p in params if p.grad is not None]
        out["grad_norm"].append(math.sqrt(sum(float((g * g).sum()) for g in grads)))
        out["max_abs"].append(max((float(g.abs().max()) for g in grads if g.numel()), default=0.0))
        out["weight_norm"].append(
            math.sqrt(sum(float((p.detach().double() ** 2).sum()) for p in params))
        )
    return {k: np.asarray(v) for k, v in out.items()}


def test_default_layers_are_every_module_with_own_parameters():
    model = _model()
    watch = GradientWatch(model, detail_every=1)
    assert [layer.name for layer in watch.layers] == [
        "",
        "features.0",
        "features.1",
        "features.3",
        "head.1",
        "out",
        "unused",
    ]
    assert watch.layers[0].param_names == ("scale",)
    assert watch.layers[2].param_names == ("features.1.weight", "features.1.bias")
    assert sorted(watch.param_names) == sorted(n for n, _ in model.named_parameters())


def test_statistics_match_plain_pytorch_over_several_steps():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    watch = GradientWatch(model, detail_every=1)
    params = dict(model.named_parameters())
    for step in range(3):
        # New .grad objects every step: the watch must not hold on to the old ones.
        optimizer.zero_grad(set_to_none=True)
        loss = _backward(model, seed=step)
        stats = watch.collect(loss)
        assert stats.step == step
        assert stats.loss == pytest.approx(loss.item(), rel=1e-6)

        for i, name in enumerate(watch.param_names):
            grad = params[name].grad
            if grad is None:
                assert stats.param_grad_norm[i] == 0.0
                continue
            assert stats.param_grad_norm[i] == pytest.approx(
                float(torch.linalg.vector_norm(grad)), rel=1e-5, abs=1e-12
            ), name

        expected = _expected(model, watch)
        np.testing.assert_allclose(stats.grad_norm, expected["grad_norm"], rtol=1e-5, atol=1e-12)
        # max |g| is exact: an element of the gradient, not an estimate.
        for j, layer_params in enumerate(_layer_params(model, watch).values()):
            grads = [p.grad for p in layer_params if p.grad is not None]
            exact = max((float(g.abs().max()) for g in grads), default=0.0)
            assert stats.max_abs[j] == exact, watch.layers[j].name
        np.testing.assert_allclose(stats.max_abs, expected["max_abs"], rtol=1e-7)
        np.testing.assert_allclose(stats.weight_norm, expected["weight_norm"], rtol=1e-5)
        total = math.sqrt(
            sum(
                float((p.grad.double() ** 2).sum())
                for p in model.parameters()
                if p.grad is not None
            )
        )
        assert stats.total_grad_norm == pytest.approx(total, rel=1e-5)
        assert not stats.nonfinite
        assert (stats.nan_count == 0).all() and (stats.inf_count == 0).all()
        optimizer.step()


def test_parameters_without_gradients():
    model = _model()
    watch = GradientWatch(model, detail_every=1)
    stats = watch.collect(_backward(model))
    unused = [layer.name for layer in watch.layers].index("unused")
    assert model.unused.weight.grad is None
    assert stats.grad_norm[unused] == 0.0
    assert stats.max_abs[unused] == 0.0
    # It requires a gradient but got none: "no gradient", not a vanishing one.
    assert stats.status[unused] == STATUS_NO_GRADIENT
    assert STATUS_NAMES[stats.status[unused]] == "no gradient"
    assert stats.nan_count[unused] == 0 and stats.inf_count[unused] == 0
    others = np.arange(len(watch.layers)) != unused
    assert (stats.status[others] == STATUS_OK).all()
    assert (stats.grad_norm[others] > 0).all()

    # Some parameters of a layer without gradients, others with them.
    model.zero_grad(set_to_none=True)
    _backward(model)
    model.out.bias.grad = None
    stats = watch.collect()
    out = [layer.name for layer in watch.layers].index("out")
    grad = model.out.weight.grad
    assert stats.grad_norm[out] == pytest.approx(float(torch.linalg.vector_norm(grad)), rel=1e-5)
    assert stats.max_abs[out] == float(grad.abs().max())
    assert stats.param_grad_norm[watch.param_names.index("out.bias")] == 0.0

    # No gradients at all (before any backward).
    model.zero_grad(set_to_none=True)
    stats = watch.collect()
    assert (stats.grad_norm == 0).all() and stats.total_grad_norm == 0.0
    assert (stats.status == STATUS_NO_GRADIENT).all()
    assert not stats.nonfinite


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_inf_and_huge_values_injected(dtype):
    model = _model().to(dtype)
    watch = GradientWatch(model, detail_every=1)
    names = [layer.name for layer in watch.layers]
    x = torch.randn(4, 3, 8, 8, dtype=dtype)
    model(x).sum().backward()

    conv, linear, out = names.index("features.0"), names.index("head.1"), names.index("out")
    g = model.features[0].weight.grad
    g.view(-1)[[0, 5, 7]] = float("nan")
    model.features[0].bias.grad[1] = float("inf")
    h = model.head[1].weight.grad
    h.view(-1)[2] = float("-inf")
    h.view(-1)[3] = float("inf")
    # Huge but finite (squares overflow float32): exploding, never Inf.
    huge = 1e30 if dtype == torch.float32 else 1e150
    model.out.weight.grad.view(-1)[:4] = huge

    stats = watch.collect()
    assert stats.nan_count[conv] == 3 and stats.inf_count[conv] == 1
    assert stats.status[conv] == STATUS_NONFINITE
    assert stats.nan_count[linear] == 0 and stats.inf_count[linear] == 2
    assert stats.status[linear] == STATUS_NONFINITE
    assert np.isinf(stats.grad_norm[linear]) and np.isinf(stats.max_abs[linear])
    assert stats.nan_count[out] == 0 and stats.inf_count[out] == 0
    assert stats.status[out] == STATUS_EXPLODING
    assert stats.max_abs[out] == pytest.approx(huge, rel=1e-6)
    # Four equal huge elements dominate the layer's norm: 2 * huge.
    assert stats.grad_norm[out] == pytest.approx(2 * huge, rel=1e-4)
    clean = [i for i in range(len(names)) if i not in (conv, linear, out)]
    assert (stats.nan_count[clean] == 0).all() and (stats.inf_count[clean] == 0).all()
    assert (stats.status[clean] != STATUS_NONFINITE).all()
    assert stats.nonfinite


def test_large_finite_float32_gradient_is_exploding_not_inf():
    model = _model()
    watch = GradientWatch(model, detail_every=1)
    _backward(model)
    # Elements of 1e20: their squares overflow float32, their norm does not.
    model.out.weight.grad.fill_(1e20)
    stats = watch.collect()
    out = [layer.name for layer in watch.layers].index("out")
    expected = float(torch.linalg.vector_norm(model.out.weight.grad.double()))
    expected = math.hypot(expected, float(model.out.bias.grad.double().norm()))
    assert stats.grad_norm[out] == pytest.approx(expected, rel=1e-5)
    assert stats.max_abs[out] == pytest.approx(1e20, rel=1e-6)
    assert stats.inf_count[out] == 0 and stats.nan_count[out] == 0
    assert stats.status[out] == STATUS_EXPLODING
    assert not stats.nonfinite


def test_tiny_gradients_keep_their_norm():
    model = _model()
    watch = GradientWatch(model, detail_every=1, vanish_steps=1)  # vanishing at once
    _backward(model)
    model.out.weight.grad.fill_(1e-30)
    model.out.bias.grad.fill_(0.0)
    stats = watch.collect()
    out = [layer.name for layer in watch.layers].index("out")
    expected = 1e-30 * math.sqrt(model.out.weight.numel())
    assert stats.grad_norm[out] == pytest.approx(expected, rel=1e-4, abs=0)
    assert stats.max_abs[out] == pytest.approx(1e-30, rel=1e-6, abs=0)
    assert stats.status[out] == STATUS_VANISHING


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_gradients_accumulate_in_float32(dtype):
    layer = nn.Linear(1000, 100).to(dtype)
    model = nn.Sequential(layer)
    watch = GradientWatch(model, detail_every=1)
    # 1e5 elements of 300: the sum of squares (9e9) overflows float16, the norm
    # (94,868) does not and must never read Inf.
    layer.weight.grad = torch.full_like(layer.weight, 300.0)
    layer.bias.grad = torch.full_like(layer.bias, -2.0)
    stats = watch.collect()
    expected = math.sqrt(1e5 * 300.0**2 + 100 * 4.0)
    assert np.isfinite(stats.grad_norm[0])
    assert stats.grad_norm[0] == pytest.approx(expected, rel=1e-3)
    assert stats.inf_count[0] == 0 and stats.nan_count[0] == 0
    assert stats.status[0] == STATUS_EXPLODING
    assert stats.max_abs[0] == 300.0
    weight_expected = math.sqrt(
        float(
            (layer.weight.detach().double() ** 2).sum() + (layer.bias.detach().double() ** 2).sum()
        )
    )
    assert stats.weight_norm[0] == pytest.approx(weight_expected, rel=1e-3)
    i = watch.param_names.index("0.weight")
    assert stats.param_grad_norm[i] == pytest.approx(
        float(torch.linalg.vector_norm(layer.weight.grad, dtype=torch.float32)), rel=1e-4
    )

    # A real Inf (and a NaN) in a half gradient is still counted.
    layer.weight.grad[0, 0] = float("inf")
    layer.weight.grad[1, 1] = float("nan")
    stats = watch.collect()
    assert stats.inf_count[0] == 1 and stats.nan_count[0] == 1
    assert stats.status[0] == STATUS_NONFINITE


def test_half_gradients_from_a_real_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(torch.bfloat16)
    watch = GradientWatch(model, detail_every=1)
    loss = model(torch.randn(5, 8, dtype=torch.bfloat16)).float().pow(2).mean()
    loss.backward()
    stats = watch.collect(loss)
    params = dict(model.named_parameters())
    for i, name in enumerate(watch.param_names):
        grad = params[name].grad
        assert stats.param_grad_norm[i] == pytest.approx(
            float(torch.linalg.vector_norm(grad, dtype=torch.float32)), rel=1e-5
        )
    assert list(stats.max_abs) == [
        max(float(params[n].grad.abs().max()) for n in layer.param_names) for layer in watch.layers
    ]


def test_layer_subset_by_glob():
    model = _model()
    watch = GradientWatch(model, layers="features.*", detail_every=1)
    assert [layer.name for layer in watch.layers] == ["features.0", "features.1", "features.3"]
    _backward(model)
    stats = watch.collect()
    expected = _expected(model, watch)
    np.testing.assert_allclose(stats.grad_norm, expected["grad_norm"], rtol=1e-5)
    np.testing.assert_allclose(stats.max_abs, expected["max_abs"], rtol=0)
    np.testing.assert_allclose(stats.weight_norm, expected["weight_norm"], rtol=1e-5)
    # The total covers the unwatched parameters too.
    total = math.sqrt(
        sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None)
    )
    assert stats.total_grad_norm == pytest.approx(total, rel=1e-5)
    assert not stats.unwatched_nonfinite

    # A NaN outside the watched layers is still noticed.
    model.out.weight.grad[0, 0] = float("nan")
    stats = watch.collect()
    assert stats.unwatched_nonfinite and stats.nonfinite
    assert (stats.status != STATUS_NONFINITE).all()


def test_container_selected_by_glob_covers_its_subtree():
    model = _model()
    watch = GradientWatch(model, layers=["head", "*.3"], detail_every=1)
    assert [layer.name for layer in watch.layers] == ["features.3", "head"]
    assert watch.layers[1].param_names == ("head.1.weight", "head.1.bias")
    _backward(model)
    stats = watch.collect()
    expected = _expected(model, watch)
    np.testing.assert_allclose(stats.grad_norm, expected["grad_norm"], rtol=1e-5)
    np.testing.assert_allclose(stats.max_abs, expected["max_abs"], rtol=0)


def test_tied_parameter_is_watched_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    model[2].weight = model[0].weight
    watch = GradientWatch(model, detail_every=1)
    assert watch.param_names == ["0.weight", "0.bias", "2.bias"]
    assert watch.layers[1].param_names == ("0.weight", "2.bias")
    model(torch.randn(3, 4)).sum().backward()
    stats = watch.collect()
    shared = model[0].weight.grad
    np.testing.assert_allclose(
        stats.grad_norm,
        [
            math.hypot(float(shared.norm()), float(model[0].bias.grad.norm())),
            math.hypot(float(shared.norm()), float(model[2].bias.grad.norm())),
        ],
        rtol=1e-5,
    )
    total = math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model.parameters()))
    assert stats.total_grad_norm == pytest.approx(total, rel=1e-5)


def test_non_contiguous_and_empty_gradients():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    empty = nn.Linear(4, 0)
    model = nn.ModuleDict({"conv": conv, "empty": empty})
    watch = GradientWatch(model, detail_every=1)
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    (conv(x).sum() + empty(torch.randn(2, 4)).sum()).backward()
    assert not conv.weight.grad.is_contiguous()
    stats = watch.collect()
    names = [layer.name for layer in watch.layers]
    c = names.index("conv")
    expected = math.hypot(float(conv.weight.grad.norm()), float(conv.bias.grad.norm()))
    assert stats.grad_norm[c] == pytest.approx(expected, rel=1e-5)
    assert stats.max_abs[c] == max(
        float(conv.weight.grad.abs().max()), float(conv.bias.grad.abs().max())
    )
    e = names.index("empty")
    assert stats.grad_norm[e] == 0.0 and stats.max_abs[e] == 0.0
