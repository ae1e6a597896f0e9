"""First non-finite origin: forward, loss and backward, on models built for each case and
on a real torchvision ResNet (in-place ReLU)."""

import pytest
import torch
import torchvision
from models.nan_models import BackwardNaN, ForwardNaN, RootMakesInf, Shared
from torch import nn

from gradscope.core.origin import locate_first_nonfinite


def _x() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(3, 4)


def test_forward_origin_is_the_custom_module_and_its_line():
    model, x = ForwardNaN(), _x()
    origin = locate_first_nonfinite(model, lambda: model(x).sum(), step=7)
    assert origin is not None
    assert (origin.step, origin.phase, origin.module, origin.tensor) == (
        7,
        "forward",
        "bad",
        "output",
    )
    assert origin.kind == "nan"
    assert origin.op == "torch.log"
    assert origin.file.endswith("nan_models.py")
    assert "torch.log(x - x.max())" in origin.code


def test_forward_origin_in_the_roots_own_code_is_the_root():
    model, x = RootMakesInf(), _x()
    origin = locate_first_nonfinite(model, lambda: model(x).sum())
    assert origin.phase == "forward"
    assert origin.module == ""
    assert origin.kind in ("nan", "inf")
    assert "torch.zeros_like(h)" in origin.code


def test_loss_origin_has_no_module():
    model, x = nn.Sequential(nn.Linear(4, 1)), _x()

    def compute_loss():
        out = model(x)
        return torch.log(out - out.max()).sum()

    origin = locate_first_nonfinite(model, compute_loss)
    assert (origin.phase, origin.module, origin.tensor) == ("loss", None, "loss")
    assert origin.op == "torch.log"


def test_backward_origin_names_the_parameter_gradient():
    model, x = BackwardNaN(), _x()
    origin = locate_first_nonfinite(model, lambda: model(x).sum())
    assert (origin.phase, origin.module, origin.tensor, origin.kind) == (
        "backward",
        "gate",
        "scale.grad",
        "inf",
    )
    assert origin.op == "torch.sqrt backward (SqrtBackward0)"
    assert "torch.sqrt(self.scale)" in origin.code


def test_finite_step_has_no_origin_and_leaves_model_untouched():
    model, x = Shared(), _x()
    model(x)["out"].sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    assert locate_first_nonfinite(model, lambda: model(x)["out"].sum()) is None
    for p, g in zip(model.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _overflow(module, args, output):
    # a forward hook runs inside the module's call: as if the module's own code overflowed
    return output * 1e39


def test_reused_module_with_dict_output():
    model, x = Shared(), _x()
    handle = model.head.register_forward_hook(_overflow)
    try:
        origin = locate_first_nonfinite(model, lambda: model(x)["out"].sum())
    finally:
        handle.remove()
    assert (origin.phase, origin.module, origin.kind) == ("forward", "head", "inf")
    assert "output * 1e39" in origin.code


def test_weights_already_nonfinite_blame_the_update():
    model, x = Shared(), _x()
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    origin = locate_first_nonfinite(model, lambda: model(x)["out"].sum(), step=4)
    assert (origin.step, origin.phase, origin.module, origin.tensor) == (
        4,
        "update",
        "head",
        "weight",
    )
    assert origin.kind == "nan" and origin.details["parameters"] == ["head.weight"]
    assert "optimizer update" in origin.details["hint"]


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).train()


def test_resnet_forward_origin_with_inplace_relu(resnet):
    x = torch.randn(2, 3, 64, 64)
    buffers = [b.clone() for b in resnet.buffers()]
    handle = resnet.layer2[0].conv1.register_forward_hook(_overflow)
    try:
        origin = locate_first_nonfinite(resnet, lambda: resnet(x).sum())
    finally:
        handle.remove()
    assert (origin.phase, origin.module, origin.kind) == ("forward", "layer2.0.conv1", "inf")
    # BatchNorm running statistics are restored after the diagnostic re-run.
    for before, after in zip(buffers, resnet.buffers(), strict=True):
        assert torch.equal(before, after)


def test_resnet_backward_origin_with_inplace_relu(resnet):
    x = torch.randn(2, 3, 64, 64)

    class Halve(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 0.5

        @staticmethod
        def backward(ctx, grad):
            return grad * float("inf")

    handle = resnet.layer3[1].bn2.register_forward_hook(lambda m, i, o: Halve.apply(o))
    try:
        origin = locate_first_nonfinite(resnet, lambda: resnet(x).sum())
    finally:
        handle.remove()
    assert origin.phase == "backward"
    assert origin.module.startswith("layer3.1")
    assert origin.tensor == "input grad"
