"""CUDA code paths: run only where a GPU exists (skipped cleanly here and in CI)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from models.nan_models import BackwardNaN, ForwardNaN
from torch import nn

from gradscope.core.origin import locate_first_nonfinite
from gradscope.core.runner import StepRunner
from gradscope.core.sources import load_with_settings
from gradscope.core.watch import STATUS_EXPLODING, GradientWatch

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


def test_seed_scenario_on_cuda():
    loaded, settings = load_with_settings(
        str(REPO / "sample_models" / "seed_explosion.py"), {"device": "cuda", "steps": 2}
    )
    runner = StepRunner(loaded, settings)
    assert runner.device.type == "cuda"
    result = runner.step()
    assert result.stats.status[0] == STATUS_EXPLODING


def test_watch_launch_does_not_synchronise():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)]).cuda()
    watch = GradientWatch(model)
    model(torch.randn(16, 64, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        transfers = watch.launch()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    stats = watch.resolve(transfers)
    expected = torch.linalg.vector_norm(model[0].weight.grad).item()
    assert stats.param_grad_norm[0] == pytest.approx(expected, rel=1e-5)


def test_half_gradients_on_cuda_have_no_false_inf():
    model = nn.Linear(1000, 100).cuda().half()
    watch = GradientWatch(model)
    for p in model.parameters():
        p.grad = torch.full_like(p, 300.0)
    stats = watch.collect()
    assert stats.nonfinite is False
    assert stats.grad_norm[0] == pytest.approx(300.0 * (1000 * 100 + 100) ** 0.5, rel=1e-3)


def test_origins_on_cuda():
    x = torch.randn(3, 4, device="cuda")
    model = ForwardNaN().cuda()
    assert locate_first_nonfinite(model, lambda: model(x).sum()).module == "bad"
    model = BackwardNaN().cuda()
    origin = locate_first_nonfinite(model, lambda: model(x).sum())
    assert (origin.phase, origin.module, origin.tensor) == ("backward", "gate", "scale.grad")


def test_collect_synchronises_once_per_step_on_normal_vanishing_and_nan_steps():
    """Issue #17: no host synchronisation per layer. ``set_sync_debug_mode("error")`` around
    the whole collect() (the transfer's explicit event wait is allowed; an implicit sync
    inside an operation raises), on a normal step, a vanishing step (tiny gradients are
    recomputed exactly) and a NaN step (NaN/Inf counted)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)]).cuda()
    watch = GradientWatch(model, detail_every=1)
    model(torch.randn(16, 64, device="cuda")).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]

    def collect_strictly(each=watch):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return each.collect()
        finally:
            torch.cuda.set_sync_debug_mode(0)

    stats = collect_strictly()
    assert stats.param_grad_norm[0] == pytest.approx(
        torch.linalg.vector_norm(grads[0]).item(), rel=1e-5
    )
    # The same gradients again, by a default watch too (a plain step after its first).
    for each in (watch, GradientWatch(model)):
        for _ in range(2):
            again = collect_strictly(each)
        np.testing.assert_array_equal(again.param_grad_norm, stats.param_grad_norm)
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g * 1e-30  # squares underflow float32: recomputed exactly, in one batch
    stats = collect_strictly()
    assert stats.param_grad_norm[0] == pytest.approx(
        torch.linalg.vector_norm(grads[0].double()).item() * 1e-30, rel=1e-4
    )
    model[0].weight.grad[0, 0] = float("nan")
    stats = collect_strictly()
    assert stats.nonfinite and stats.nan_count[0] == 1


def test_user_statistics_on_cuda_need_no_host_synchronisation():
    """Issue #36: a user's parameter and forward statistics travel with the step's one
    transfer: neither the forward (hooks armed) nor ``launch()`` synchronises, and the
    figures equal plain torch's."""
    import gradscope

    class GradRMS(gradscope.Statistic):
        name = "grad_rms"
        combine = "max"
        every = 1

        def parameter(self, grad, weight):
            return grad.float().pow(2).mean().sqrt()

    class OutRMS(gradscope.Statistic):
        name = "out_rms"
        every = 1

        def output(self, module, output):
            return output.float().pow(2).mean().sqrt()

    torch.manual_seed(0)
    # Large layers (fused reads) and 40 small ones of one shape (stacked reads).
    model = nn.Sequential(
        nn.Linear(64, 96), *[nn.Linear(8, 8) if i else nn.Linear(96, 8) for i in range(40)]
    ).cuda()
    # replay=False: the step capture's own check is test_watch_launch_does_not_synchronise's.
    watch = gradscope.watch(model, statistics=[GradRMS(), OutRMS()], replay=False)
    x = torch.randn(16, 64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = model(x).square().mean()
        loss.backward()
        transfers = watch.launch(loss)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    stats = watch.resolve(transfers)
    modules = dict(model.named_modules())
    expected = [
        max(float(p.grad.double().square().mean().sqrt()) for p in modules[layer.name].parameters())
        for layer in watch.layers
    ]
    np.testing.assert_allclose(stats.figures["grad_rms"], expected, rtol=1e-5)
    outputs, h = [], x
    with torch.no_grad():
        for module in model:
            h = module(h)
            outputs.append(float(h.double().square().mean().sqrt()))
    np.testing.assert_allclose(stats.figures["out_rms"], outputs, rtol=1e-5)
    watch.close()


def test_early_warnings_on_cuda_warn_ahead_and_read_without_synchronising():
    """Issue #37: the float16 residual stream of a drift case on the GPU warns before it fails,
    and its forward statistics (output max |x|, the head's log-partition) add no host
    synchronisation to the forward or to ``launch()``."""
    from models.drift_cases import ResidualClassifier

    import gradscope

    torch.manual_seed(0)
    model = ResidualClassifier(torch.float16).cuda()
    watch = gradscope.watch(model, early_warnings=True, detail_every=1, replay=False)
    x = torch.randn(64, 32, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        transfers = watch.launch(loss)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    watch.resolve(transfers)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.2)
    first_warning = failed = None
    for step in range(1, 200):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x + 2 * torch.randn_like(x)), y)
        loss.backward()
        stats = watch.collect(loss)
        if stats.warnings and first_warning is None:
            first_warning = stats.warnings[0]
        if not torch.isfinite(loss):
            failed = step
            break
        optimizer.step()
    watch.close()
    assert first_warning is not None and first_warning.kind == "low headroom"
    assert first_warning.module.startswith("blocks.")
    if failed is not None:  # on one batch it fails sooner than the CPU case (step 102)
        assert first_warning.step < failed
