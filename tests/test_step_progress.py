"""Progress within a long step, module by module, and abandoning it (core.step_progress)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradscope.core.step_progress import StepAborted, StepProgress, progress_modules


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)
    )


def test_counts_forward_then_backward_modules() -> None:
    model = _model()
    progress = StepProgress()
    progress.attach(model)
    assert progress.modules == 5
    seen = []
    model[2].register_forward_hook(lambda *_: seen.append(progress.snapshot()))
    progress.begin(7)
    loss = model(torch.randn(3, 4)).sum()
    middle = seen[0]
    # model[2]'s own hook ran after the progress hook: three modules are done
    assert middle.step == 7 and middle.forward_done == 3 and middle.backward_done == 0
    assert "forward 3/5" in middle.describe()
    loss.backward()
    done = progress.snapshot()
    assert done.forward_done == 5 and done.backward_done == 5
    assert "backward 5/5" in done.describe()
    progress.end()
    assert progress.snapshot() is None
    progress.detach()
    assert not model[0]._forward_hooks


def test_the_gradients_are_those_of_an_unhooked_model() -> None:
    x = torch.randn(3, 4)
    plain, hooked = _model(), _model()
    progress = StepProgress()
    progress.attach(hooked)
    progress.begin(0)
    plain(x).sum().backward()
    hooked(x).sum().backward()
    for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_abort_abandons_the_step_at_the_next_module(phase: str) -> None:
    model = _model()
    progress = StepProgress()
    progress.attach(model)
    progress.begin(0)
    if phase == "forward":
        model[1].register_forward_hook(lambda *_: progress.abort())
        with pytest.raises(StepAborted):
            model(torch.randn(3, 4))
        assert progress.snapshot().forward_done == 2
    else:
        loss = model(torch.randn(3, 4)).sum()
        progress.abort()
        with pytest.raises(StepAborted):
            loss.backward()
        assert progress.snapshot().backward_done == 0
    # Not an Exception: no "except Exception" treats it as the model's error.
    assert not issubclass(StepAborted, Exception)


def test_small_fast_models_are_not_hooked() -> None:
    model = _model()
    progress = StepProgress()
    assert not progress.attach_if_useful(model, last_step_seconds=0.001)
    assert not model[0]._forward_hooks
    assert progress.attach_if_useful(model, last_step_seconds=2.0)
    big = nn.Sequential(nn.Linear(3000, 2000))
    assert StepProgress().attach_if_useful(big, last_step_seconds=None)


def test_a_wrapper_and_a_stack_of_blocks_are_looked_into() -> None:
    inner = _model()
    wrapped = nn.Sequential(inner)
    assert progress_modules(wrapped) == list(inner.children())
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(12)])
    model = nn.Sequential(nn.Linear(4, 8), blocks, nn.Linear(8, 1))
    # the stack is replaced by its blocks, the largest block by its layers, to ~16
    assert len(progress_modules(model)) == 16


def test_resnet_with_inplace_relu_runs_hooked() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=3)
    progress = StepProgress()
    progress.attach(model)
    progress.begin(0)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    snapshot = progress.snapshot()
    # The largest children are looked into (layer4, layer3...), each module counted once
    # though BasicBlock calls its ReLU twice.
    assert 16 <= progress.modules <= 24
    assert snapshot.forward_done == snapshot.backward_done == progress.modules
