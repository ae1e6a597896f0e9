"""Diagnosis to the line: the op, the user's line, the values that led there and a hint, on
models that were not written for GradScope. Real torch, no mocks."""

import torch
from models.foreign_models import DeepNest, PaddedAttention, TiedTwice

from gradscope.core.diagnosis import base_op
from gradscope.core.origin import locate_first_nonfinite


def _assert_points_into(origin, filename: str, text: str) -> None:
    assert origin.file.endswith(filename), origin.file
    assert "site-packages" not in origin.file
    assert text in origin.code, origin.code


def test_nested_containers_inplace_division():
    torch.manual_seed(0)
    model, x = DeepNest(), torch.randn(3, 8)
    origin = locate_first_nonfinite(model, lambda: model(x)["logits"].sum())
    assert (origin.phase, origin.module) == ("forward", "stages.2.0.1")
    assert base_op(origin.op) == "div"
    _assert_points_into(origin, "foreign_models.py", "y.div_(self.gain - 1.0)")
    inputs = origin.details["values"]["inputs"]
    assert inputs and all(v["nan"] == 0 and v["inf"] == 0 for v in inputs)
    assert "divided by zero" in origin.details["hint"]


def test_attention_with_a_fully_padded_row():
    torch.manual_seed(0)
    model = PaddedAttention()
    x = torch.randn(2, 5, 4)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1] = True  # the second sequence is all padding
    origin = locate_first_nonfinite(model, lambda: model(x, padding).sum())
    assert (origin.phase, origin.module, origin.kind) == ("forward", "attn", "nan")
    # the intentional -inf mask is not blamed; the softmax that turns it into NaN is
    assert "softmax" in origin.op or "attention" in origin.op, origin.op
    _assert_points_into(origin, "foreign_models.py", "self.attn(h, h, h, key_padding_mask=padding)")
    assert "masked" in origin.details["hint"]


def test_module_called_twice_with_half_overflow():
    torch.manual_seed(0)
    model, x = TiedTwice(), torch.randn(4, 8) * 3
    origin = locate_first_nonfinite(model, lambda: model(x).sum())
    assert (origin.phase, origin.module, origin.kind) == ("forward", "", "inf")
    assert base_op(origin.op) in ("exp", "mul", "__mul__"), origin.op
    _assert_points_into(origin, "foreign_models.py", "torch.exp(h.half() * 40)")
    assert "float16" in origin.details["hint"]


def test_backward_sqrt_hint_and_gradient_values():
    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.sqrt((self.lin(x) * 0).pow(2).sum(dim=1))

    model = Norm()
    origin = locate_first_nonfinite(model, lambda: model(torch.randn(2, 3)).sum())
    assert origin.phase == "backward" and origin.module == ""
    assert origin.op.startswith("torch.sqrt backward")
    assert origin.details["values"]["grad_in"][0]["inf"] == 0
    assert origin.details["values"]["grad_out"][0]["inf"] > 0
    assert "infinite at 0" in origin.details["hint"]


def test_loss_overflow_hint():
    model = torch.nn.Linear(3, 1)
    origin = locate_first_nonfinite(model, lambda: model(torch.ones(2, 3)).sum() * 1e38 * 1e10)
    assert origin.phase == "loss" and origin.kind == "inf"
    assert "loss" in origin.details["hint"].lower()


def test_resnet18_diagnosis_is_fast():
    import time

    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    # the module's own computation overflows (a forward hook runs inside its call)
    model.layer4[0].bn1.register_forward_hook(lambda m, i, out: out * 1e39)
    x = torch.randn(2, 3, 64, 64)
    started = time.perf_counter()
    origin = locate_first_nonfinite(
        model, lambda: torch.nn.functional.cross_entropy(model(x), torch.tensor([1, 2]))
    )
    elapsed = time.perf_counter() - started
    assert (origin.phase, origin.module) == ("forward", "layer4.0.bn1")
    # generous bound for a loaded CI machine; the benchmark figure is far lower
    assert elapsed < 10
