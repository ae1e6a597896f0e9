"""First-origin diagnosis on the model shapes real projects have: bad data (phase "input"),
additive -inf masks, activation checkpointing (both forms and checkpoint_sequential), custom
autograd Functions, losses computed inside forward; and a re-run that leaves the model as it
was. Real models, real autograd."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from models import real_models
from models.real_models import (
    CHECKPOINT_MODES,
    Checkpointed,
    CriterionInForward,
    DistanceBlock,
    FeatureLog,
    FunctionNet,
    GradNormalizer,
    LogBlock,
    LossInForward,
    MaskedEncoder,
    SentinelOverflow,
    SmallCNN,
    SqrtHead,
    StatefulNet,
    TabularNet,
    additive_mask,
)
from torch import nn
from torch.overrides import _get_current_function_mode_stack

from gradscope.core.diagnosis import explain
from gradscope.core.origin import locate_first_nonfinite, loss_from_output

SOURCE = Path(real_models.__file__)


def line_of(marker: str) -> int:
    lines = [i for i, text in enumerate(SOURCE.read_text().splitlines(), 1) if marker in text]
    assert len(lines) == 1, (marker, lines)
    return lines[0]


def _where(origin) -> tuple:
    return (origin.step, origin.phase, origin.module, origin.tensor, origin.kind, origin.op)


def _assert_nothing_left(model: nn.Module) -> None:
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert _get_current_function_mode_stack() == []


# -- 1. bad data ------------------------------------------------------------------------------
def test_nan_feature_in_a_dict_batch_is_the_inputs_fault():
    torch.manual_seed(0)
    model = TabularNet()
    numeric = torch.randn(6, 4)
    numeric[3, 2] = float("nan")
    numeric[5, 0] = float("nan")
    inputs = {"numeric": numeric, "category": torch.randint(0, 10, (6,))}
    target = torch.randn(6, 1)
    batch = (inputs, target)
    origin = locate_first_nonfinite(
        model, lambda: F.mse_loss(model(**inputs), target), step=12, batch=batch
    )
    assert (origin.step, origin.phase, origin.module, origin.tensor, origin.kind) == (
        12,
        "input",
        None,
        'inputs["numeric"]',
        "nan",
    )
    assert origin.op is None and origin.file is None
    assert origin.details["count"] == 2
    assert origin.details["samples"] == [3, 5]
    assert origin.details["positions"] == [[3, 2], [5, 0]]
    hint = origin.details["hint"]
    assert "batch" in hint and "sample" in hint and "nan_to_num" in hint and "stopgap" in hint
    text = origin.describe()
    assert 'inputs["numeric"]' in text and "samples 3, 5" in text and "input" in text
    assert any("(3, 2)" in line for line in explain(origin))
    _assert_nothing_left(model)


def test_nan_label_is_the_targets_fault():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    y[1, 0] = float("nan")
    origin = locate_first_nonfinite(model, lambda: F.mse_loss(model(x), y), batch=(x, y))
    assert (origin.phase, origin.module, origin.tensor, origin.kind) == (
        "input",
        None,
        "target",
        "nan",
    )
    assert origin.details["samples"] == [1]


def test_inf_pixel_blames_the_image_not_the_convolution():
    torch.manual_seed(0)
    model = SmallCNN()
    images, labels = torch.randn(3, 3, 8, 8), torch.tensor([0, 1, 2])
    images[2, 1, 4, 5] = float("inf")
    origin = locate_first_nonfinite(
        model, lambda: F.cross_entropy(model(images), labels), batch=(images, labels)
    )
    assert (origin.phase, origin.module, origin.tensor, origin.kind) == (
        "input",
        None,
        "inputs",
        "inf",
    )
    assert origin.details["positions"] == [[2, 1, 4, 5]]
    assert origin.details["values"]["batch"][0]["max"] == float("inf")
    # what the model alone would be blamed for: the layer that turned the Inf into NaN
    assert "module 'head'" in origin.details["model_origin"]


def test_inf_target_that_only_reaches_the_loss_is_the_targets_fault():
    model = nn.Linear(3, 1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    y[0, 0] = float("-inf")
    origin = locate_first_nonfinite(model, lambda: F.mse_loss(model(x), y), batch=(x, y))
    assert (origin.phase, origin.tensor, origin.kind) == ("input", "target", "inf")


def test_nan_the_model_imputes_does_not_hide_its_own_failure():
    torch.manual_seed(0)
    model = real_models.NanAwareNet()
    readings, target = torch.randn(3, 4), torch.randn(3, 1)
    readings[1, 2] = float("nan")  # a missing reading, imputed by the model
    origin = locate_first_nonfinite(
        model, lambda: F.mse_loss(model(readings), target), batch=(readings, target)
    )
    assert (origin.phase, origin.module, origin.kind, origin.op) == (
        "forward",
        "head",
        "inf",
        "torch.log",
    )


def test_nan_in_the_data_that_reaches_a_backward_nan_is_still_the_datas_fault():
    torch.manual_seed(0)
    model = SmallCNN()
    images, labels = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    images[0, 0, 0, 0] = float("nan")
    origin = locate_first_nonfinite(
        model, lambda: F.cross_entropy(model(images), labels), batch=(images, labels)
    )
    assert (origin.phase, origin.tensor, origin.kind) == ("input", "inputs", "nan")
    assert origin.details["samples"] == [0]


def test_without_the_batch_the_models_call_arguments_are_checked():
    torch.manual_seed(0)
    model = TabularNet()
    numeric = torch.randn(4, 4)
    numeric[0, 0] = float("nan")
    category = torch.randint(0, 10, (4,))
    origin = locate_first_nonfinite(model, lambda: model(numeric, category).sum())
    assert (origin.phase, origin.module, origin.tensor, origin.kind) == (
        "input",
        None,
        "inputs[0]",
        "nan",
    )
    assert origin.details["source"] == "model call"
    assert "already" in origin.details["hint"]


def test_an_unused_inf_in_the_batch_does_not_hide_the_models_own_overflow():
    torch.manual_seed(0)
    model = SentinelOverflow()
    with torch.no_grad():
        model.proj.weight.fill_(1.0)
    x, max_len = torch.ones(2, 4), torch.tensor([float("inf"), 5.0])
    origin = locate_first_nonfinite(
        model, lambda: model(x, max_len).sum(), batch=((x, max_len), torch.zeros(2))
    )
    assert (origin.phase, origin.module, origin.kind, origin.op) == (
        "forward",
        "amplify",
        "inf",
        "torch.exp",
    )
    assert origin.line == line_of("# <- exp")


# -- 2. values non-finite by design -------------------------------------------------------------
def test_additive_mask_in_the_batch_is_no_error():
    torch.manual_seed(0)
    model = MaskedEncoder()
    x, mask = torch.randn(2, 5, 4), additive_mask(2, 5)
    assert bool(torch.isfinite(model(x, mask)).all())
    assert (
        locate_first_nonfinite(model, lambda: model(x, mask).sum(), batch=((x, mask), None)) is None
    )
    assert locate_first_nonfinite(model, lambda: model(x, mask).sum()) is None


def test_a_module_receiving_a_mask_can_still_be_the_origin():
    """Every module downstream of the -inf mask receives it; a later module's own failure
    (log of zero in head) is still blamed on that module, with its op and line."""
    torch.manual_seed(0)
    model = MaskedEncoder(log_of_zero=True)
    x, mask = torch.randn(2, 5, 4), additive_mask(2, 5)
    origin = locate_first_nonfinite(model, lambda: model(x, mask).sum(), batch=((x, mask), None))
    assert (origin.phase, origin.module, origin.kind, origin.op) == (
        "forward",
        "head",
        "inf",
        "torch.log",
    )
    assert origin.line == line_of("# <- log of zero")


def test_fully_masked_row_blames_the_attention_module_its_op_and_its_line():
    torch.manual_seed(0)
    model = MaskedEncoder()
    x, mask = torch.randn(2, 5, 4), additive_mask(2, 5, empty_row=True)
    for batch in (((x, mask), None), None):
        origin = locate_first_nonfinite(model, lambda: model(x, mask).sum(), batch=batch)
        # module, op and line agree: the attention module, its softmax, the softmax line
        assert (origin.phase, origin.module, origin.kind, origin.op) == (
            "forward",
            "attn",
            "nan",
            "torch.softmax",
        )
        assert origin.line == line_of("# <- softmax")
        assert origin.details["values"]["inputs"][0]["min"] == float("-inf")
        assert "masked" in origin.details["hint"]
        assert any("min -inf" in line for line in explain(origin))


def test_masked_fill_with_minus_inf_is_by_design():
    class Filled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, keep):
            scores = self.lin(x).masked_fill(~keep, float("-inf"))
            return torch.logsumexp(scores, dim=-1)

    torch.manual_seed(0)
    model, x = Filled(), torch.randn(3, 4)
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[:, 0] = False
    assert locate_first_nonfinite(model, lambda: model(x, keep).sum()) is None


def test_a_module_returning_a_buffer_mask_is_not_the_origin():
    torch.manual_seed(0)
    model, x = real_models.BufferMaskedNet(), torch.randn(2, 5, 4)
    origin = locate_first_nonfinite(model, lambda: model(x))
    assert (origin.phase, origin.module, origin.kind, origin.op) == (
        "forward",
        "head",
        "inf",
        "torch.log",
    )


def test_an_inf_absorbed_inside_a_module_is_not_the_origin():
    torch.manual_seed(0)
    model, x = real_models.AbsorbedThenRoot(), torch.ones(3, 4)
    origin = locate_first_nonfinite(model, lambda: model(x).sum())
    assert (origin.phase, origin.module, origin.kind) == ("forward", "", "inf")
    assert origin.line == line_of("# <- root division")


# -- 3. activation checkpointing ----------------------------------------------------------------
def _checkpoint_origins(block_factory, head_factory=None):
    origins = {}
    x = torch.randn(3, 4)
    for mode in ("none", *CHECKPOINT_MODES):
        torch.manual_seed(0)
        head = head_factory() if head_factory else None
        model = Checkpointed(block_factory(), mode, head)
        origins[mode] = locate_first_nonfinite(model, lambda m=model: m(x).sum(), step=3)
        _assert_nothing_left(model)
    return origins


def _same_as_plain(origins) -> object:
    plain = origins["none"]
    assert plain is not None
    for mode, origin in origins.items():
        assert origin is not None, mode
        assert _where(origin) == _where(plain), mode
        assert (origin.file, origin.line) == (plain.file, plain.line), mode
    return plain


def test_checkpointed_backward_nan_is_found_like_without_checkpointing():
    plain = _same_as_plain(_checkpoint_origins(DistanceBlock))
    assert (plain.phase, plain.module) == ("backward", "blocks.1")
    assert plain.op.startswith("Tensor.sqrt backward")
    assert plain.line == line_of("# <- sqrt")


def test_healthy_checkpointed_block_with_a_backward_nan_after_it():
    plain = _same_as_plain(_checkpoint_origins(lambda: nn.Linear(4, 4), SqrtHead))
    assert (plain.phase, plain.module) == ("backward", "head")
    assert plain.line == line_of("# <- head sqrt")


def test_checkpointed_forward_nan_is_found_like_without_checkpointing():
    plain = _same_as_plain(_checkpoint_origins(LogBlock))
    assert (plain.phase, plain.module, plain.op) == ("forward", "blocks.1", "torch.log")
    assert plain.line == line_of("# <- checkpointed log")


def test_checkpointed_model_trains_normally_after_the_diagnosis():
    torch.manual_seed(0)
    model = Checkpointed(DistanceBlock(), "reentrant")
    x = torch.randn(3, 4)
    locate_first_nonfinite(model, lambda: model(x).sum())
    # the recomputation wrapper belongs to that one graph: a new step is plain again
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


# -- 4. custom autograd.Function ----------------------------------------------------------------
def test_custom_function_forward_is_the_function_at_its_apply_line():
    torch.manual_seed(0)
    model, x = FunctionNet(FeatureLog()), torch.randn(3, 4)
    origin = locate_first_nonfinite(model, lambda: model(x).sum())
    assert (origin.phase, origin.module, origin.kind, origin.op) == (
        "forward",
        "part",
        "inf",
        "UnsafeLog",
    )
    assert origin.line == line_of("# <- UnsafeLog.apply")
    assert origin.details["inside"]["op"] == "torch.log"
    assert "autograd.Function" in origin.details["hint"]


def test_custom_function_backward_is_credited_to_the_function_not_its_consumer():
    torch.manual_seed(0)
    model, x = FunctionNet(GradNormalizer()), torch.randn(3, 4)
    origin = locate_first_nonfinite(model, lambda: model(x).sum() * 0)
    assert (origin.phase, origin.module, origin.tensor, origin.kind) == (
        "backward",
        "part",
        "input grad",
        "nan",
    )
    assert origin.op == "NormalizeGrad backward (NormalizeGradBackward)"
    assert origin.line == line_of("# <- NormalizeGrad.apply")
    assert "backward formula" in origin.details["hint"]
    _assert_nothing_left(model)


# -- 5. losses computed inside forward ----------------------------------------------------------
@pytest.mark.parametrize("returns", ["dict", "dataclass", "model-output"])
def test_nan_made_by_a_loss_inside_forward_is_phase_forward(returns):
    torch.manual_seed(0)
    model = LossInForward(returns)
    x, labels = torch.randn(4, 4), torch.full((4,), -100)  # every target ignored: 0/0
    origin = locate_first_nonfinite(model, lambda: model(x, labels), batch=((x, labels), None))
    assert (origin.phase, origin.module, origin.kind, origin.op) == (
        "forward",
        "",
        "nan",
        "F.cross_entropy",
    )
    assert origin.line == line_of("# <- loss in forward")
    assert "ignore_index" in origin.details["hint"]


def test_nan_made_by_a_child_loss_module():
    torch.manual_seed(0)
    model = CriterionInForward()
    x, labels = torch.randn(4, 4), torch.full((4,), -100)
    origin = locate_first_nonfinite(model, lambda: model(x, labels))
    assert (origin.phase, origin.module, origin.kind) == ("forward", "criterion", "nan")
    assert origin.op == "F.cross_entropy"


def test_model_forward_called_directly_is_still_the_models_code():
    torch.manual_seed(0)
    model = LossInForward("dict")
    x, labels = torch.randn(4, 4), torch.full((4,), -100)
    origin = locate_first_nonfinite(model, lambda: model.forward(x, labels))
    assert (origin.phase, origin.module, origin.op) == ("forward", "", "F.cross_entropy")


def test_loss_from_output():
    loss = torch.tensor(1.5)
    assert loss_from_output(loss) is loss
    assert loss_from_output({"loss": loss, "logits": None}) is loss
    assert loss_from_output(real_models.ClassifierOutput(loss, torch.zeros(1))) is loss
    assert loss_from_output(real_models.ModelOutputLike(loss=loss)) is loss
    with pytest.raises(TypeError, match="None"):
        loss_from_output(real_models.ClassifierOutput(None, torch.zeros(1)))
    with pytest.raises(TypeError, match="'loss'"):
        loss_from_output((loss, loss))


# -- the re-run leaves the model as it was ------------------------------------------------------
def test_rerun_restores_weights_gradients_and_batchnorm_buffers():
    torch.manual_seed(0)
    model = StatefulNet().train()
    ids = torch.tensor([0, 1, 2, 3, 4, 5])
    with torch.no_grad():
        model.embed.weight.mul_(10)  # rows above max_norm: the forward renormalises them
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    grads = {name: p.grad for name, p in model.named_parameters()}
    buffers = {name: b.clone() for name, b in model.named_buffers()}

    origin = locate_first_nonfinite(model, lambda: model(ids).sum(), batch=(ids, None))
    assert (origin.phase, origin.module) == ("backward", "gate")

    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name]), f"{name} changed"
        assert p.grad is grads[name] and bool((p.grad == 0.25).all()), f"{name}.grad changed"
    for name, b in model.named_buffers():
        assert torch.equal(b, buffers[name]), f"buffer {name} changed"
    assert int(model.norm.num_batches_tracked) == 0
    _assert_nothing_left(model)


def test_a_failing_rerun_leaves_nothing_behind():
    torch.manual_seed(0)
    model = StatefulNet().train()
    ids = torch.tensor([0, 1, 2, 3])
    buffers = {name: b.clone() for name, b in model.named_buffers()}

    def compute_loss():
        model(ids)
        raise RuntimeError("the user's loss code broke")

    with pytest.raises(RuntimeError, match="loss code broke"):
        locate_first_nonfinite(model, compute_loss)
    for name, b in model.named_buffers():
        assert torch.equal(b, buffers[name]), name
    _assert_nothing_left(model)
