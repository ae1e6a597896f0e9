"""One test per hint rule (gradscope/core/hints/): each builds, with real torch, the evidence
its rule states, checks that the hint names that evidence (the values, the counts, the
limit) and that the rule is the one chosen; most also check the rule declines the
look-alike without that evidence. Test names say the evidence."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from models.masked_vocab import RestrictedVocabSafeLM, RestrictedVocabSmoothedLM
from torch import nn

from gradscope.core import hints
from gradscope.core.hints import (
    backward_divide_by_subnormal,
    backward_divide_by_zero,
    backward_domain_edge,
    backward_half_overflow,
    backward_half_underflow,
    backward_large_derivative,
    backward_of_discarded_nonfinite,
    backward_overflow,
    backward_overflow_of_large_values,
    backward_root_at_zero,
    bad_batch,
    cast_overflow,
    cross_entropy_empty_mean,
    cross_entropy_masked_target,
    cross_entropy_smoothing_over_mask,
    ctc_no_alignment,
    custom_function,
    default_loss,
    division,
    division_by_empty_count,
    exp_overflow,
    forward_domain_edge,
    fractional_power_of_negative,
    half_overflow,
    log_of_negative,
    log_of_zero,
    loss_overflow,
    mask_aggregated,
    mask_made_nan,
    mask_reached_loss,
    mask_value_overflow,
    nonfinite_input_to_nan,
    outside_domain,
    overflow,
    reciprocal_of_zero,
    reduction_of_too_few,
    root_of_cancellation,
    root_of_negative,
    softmax_fully_masked,
    softmax_of_inf,
    unsure,
    weights_broken_by_update,
    weights_never_initialised,
    zero_times_inf,
)
from gradscope.core.origin import Origin, locate_first_nonfinite

MASKED_VOCAB = Path(sys.modules[RestrictedVocabSmoothedLM.__module__].__file__)


class Wrapped(nn.Module):
    """``fn(x * scale)`` with a trainable scale of 1: a model around one computation."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], dtype=torch.float32) -> None:
        super().__init__()
        self.fn = fn
        self.scale = nn.Parameter(torch.ones((), dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x * self.scale)


def _locate(fn, x: torch.Tensor, dtype=torch.float32) -> Origin:
    model = Wrapped(fn, dtype)
    origin = locate_first_nonfinite(model, lambda: model(x).float().sum())
    assert origin is not None
    return origin


def _chosen(origin: Origin, rule) -> str:
    """The rule's hint, which must be the one GradScope gives."""
    text = rule.hint(origin)
    assert text, f"{rule.__name__} declined: {origin.op} {origin.details.get('hint')}"
    assert origin.details["hint"] == hints.hint_for(origin) == text
    return text


def test_every_rule_states_its_evidence():
    for rule in (*hints.RULES, unsure.hint):
        module = sys.modules[rule.__module__]
        assert module.__doc__ and module.__doc__.startswith("Evidence:"), module.__name__


# -- the batch and the weights --------------------------------------------------------------
def test_bad_batch_evidence_nan_in_sample_3_of_the_batch():
    model = nn.Linear(4, 1)
    x, target = torch.randn(5, 4), torch.randn(5, 1)
    x[3, 1] = math.nan
    origin = locate_first_nonfinite(model, lambda: F.mse_loss(model(x), target), batch=(x, target))
    text = _chosen(origin, bad_batch)
    assert "in the batch (your data), not in the model or the loss" in text
    assert "sample 3 of the batch" in text
    assert "in the batch (your data), not in the model or the loss" in origin.describe()


def test_weights_broken_by_update_evidence_nan_weights_before_the_forward():
    model = nn.Linear(4, 1)
    with torch.no_grad():
        model.weight[0, 2] = math.nan
    origin = locate_first_nonfinite(model, lambda: model(torch.randn(2, 4)).sum())
    text = _chosen(origin, weights_broken_by_update)
    assert "previous step wrote them" in text and "float16" not in text
    half = nn.Linear(4, 1).half()
    with torch.no_grad():
        half.weight[0, 0] = math.inf
    origin = locate_first_nonfinite(half, lambda: half(torch.randn(2, 4).half()).float().sum())
    assert "eps (1e-8) rounds to 0 in float16" in _chosen(origin, weights_broken_by_update)
    assert "autocast + GradScaler" in origin.details["hint"]
    origin.details["loss_scaler"] = True
    assert "GradScaler stays as it is" in weights_broken_by_update.hint(origin)


def test_weights_never_initialised_evidence_nan_at_the_first_step_seen():
    import gradscope

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    with torch.no_grad():
        model[1].weight.fill_(math.nan)
    watch = gradscope.watch(model)
    x = torch.randn(3, 4)
    loss = model(x).sum()
    loss.backward()
    origin = watch.collect(loss, locate=lambda: model(x).sum()).origin
    text = _chosen(origin, weights_never_initialised)
    assert "before any optimizer step" in text and "reset_parameters()" in text
    origin.details["at_start"] = False
    assert weights_never_initialised.hint(origin) is None


# -- the user's own autograd.Function ---------------------------------------------------------
class _BadBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / (x * 0)


def test_custom_function_evidence_its_backward_made_inf_from_a_finite_gradient():
    origin = _locate(_BadBackward.apply, torch.randn(3))
    assert origin.phase == "backward"
    text = _chosen(origin, custom_function)
    assert "backward of the custom autograd.Function _BadBackward" in text


# -- backward ----------------------------------------------------------------------------
def test_backward_root_at_zero_evidence_saved_forward_values_exactly_zero():
    origin = _locate(lambda h: torch.sqrt((h * 0).pow(2).sum()), torch.randn(3))
    text = _chosen(origin, backward_root_at_zero)
    assert "infinite at 0" in text and "exactly 0" in text


def test_backward_divide_by_zero_evidence_saved_denominator_zeros_under_where():
    # the classic torch.where NaN: the masked branch's gradient is 0/0
    def safe_ratio(h):
        y = h * torch.tensor([1.0, 0.0, 1.0])
        return torch.where(y != 0, h / y, torch.zeros_like(h))

    origin = _locate(safe_ratio, torch.randn(3))
    assert origin.phase == "backward"
    text = _chosen(origin, backward_divide_by_zero)
    assert "divides by its denominator, which is zero here (1 exact zeros)" in text


def test_backward_large_derivative_evidence_no_saved_zero_and_a_large_gradient():
    origin = _locate(lambda h: torch.sqrt(h) * 1e30, torch.full((3,), 1e-30))
    text = _chosen(origin, backward_large_derivative)
    assert "no forward value it saved is 0 (smallest |value| 1e-15, in its saved result)" in text
    assert "arriving was up to 1e+30" in text
    assert "a smaller loss (or loss scale) also helps" in text
    assert "clip" not in text  # clipping runs after backward: too late for this overflow
    assert backward_root_at_zero.hint(origin) is None


def test_backward_domain_edge_evidence_acos_at_one():
    origin = _locate(lambda h: torch.acos(h / h), torch.full((2,), 0.5))
    text = _chosen(origin, backward_domain_edge)
    assert "infinite at +-1" in text


def test_backward_half_overflow_evidence_float16_gradient_from_a_finite_one():
    origin = _locate(lambda h: (h * 300) * 300, torch.full((2,), 1e-3).half(), torch.float16)
    assert origin.phase == "backward"
    text = _chosen(origin, backward_half_overflow)
    assert "gradient arriving was at most 300" in text and "65,504" in text
    assert "Use torch.amp.GradScaler" in text
    # a loop that has a scaler (the watch sets loss_scaler) is not told to add one
    origin.details["loss_scaler"] = True
    text = backward_half_overflow.hint(origin)
    assert "already scales the loss with a GradScaler" in text
    assert "Use torch.amp.GradScaler" not in text


def test_backward_overflow_evidence_float32_gradient_from_a_finite_one():
    origin = _locate(lambda h: (h * 1e20) * 1e20, torch.full((2,), 1e-30))
    assert origin.phase == "backward" and origin.kind == "inf"
    text = _chosen(origin, backward_overflow)
    assert "arriving there was finite (largest |value| 1e+20)" in text


# -- evidence from the op's arguments ---------------------------------------------------------
def test_ctc_no_alignment_evidence_more_labels_than_frames():
    torch.manual_seed(0)
    model = nn.Linear(6, 5)
    x = torch.randn(4, 1, 6)
    targets = torch.tensor([[1, 2, 3, 4, 1]])

    def compute_loss():
        return F.ctc_loss(model(x).log_softmax(-1), targets, torch.tensor([4]), torch.tensor([5]))

    origin = locate_first_nonfinite(model, compute_loss)
    text = _chosen(origin, ctc_no_alignment)
    assert "sample 0 has 5 target labels but only 4 input frames" in text


def test_cross_entropy_empty_mean_evidence_every_target_ignored():
    model = nn.Linear(4, 3)
    x, target = torch.randn(2, 4), torch.tensor([-100, -100])
    origin = locate_first_nonfinite(model, lambda: F.cross_entropy(model(x), target))
    text = _chosen(origin, cross_entropy_empty_mean)
    assert "every one of the 2 targets is ignore_index (-100)" in text and "0/0" in text
    assert "with reduction='mean'" in text  # the argument that makes it 0/0


@pytest.mark.filterwarnings("ignore:std.. degrees of freedom")
def test_reduction_of_too_few_evidence_std_over_one_element():
    # advantage normalisation with a batch of one: std divides by n - 1 = 0
    origin = _locate(lambda h: (h - h.mean()) / h.std(), torch.randn(1))
    assert origin.kind == "nan" and "std" in origin.op
    text = _chosen(origin, reduction_of_too_few)
    assert "reduced over one element with a correction of 1" in text
    assert "1 - 1 = 0" in text and "overflow" not in text
    # the same statistic with the correction the data allows is no origin at all
    model = Wrapped(lambda h: (h - h.mean()) / h.std(correction=0))
    assert locate_first_nonfinite(model, lambda: model(torch.randn(2)).sum()) is None


def test_reduction_of_too_few_evidence_mean_over_an_empty_selection():
    # a masked mean over a batch where the mask keeps nothing
    origin = _locate(lambda h: h[h > 100].mean(), torch.randn(4))
    text = _chosen(origin, reduction_of_too_few)
    assert "reduced over 0 elements with a correction of 0" in text and "0/0" in text


def test_default_loss_evidence_the_op_ran_in_gradscopes_default_loss():
    from gradscope.core.runner import StepRunner
    from gradscope.core.sources import load_with_settings

    path = Path(__file__).parent.parent / "sample_models" / "exploding_gru_long_sequences.py"
    loaded, settings = load_with_settings(str(path), {})
    loaded.loss_fn = None
    runner = StepRunner(loaded, settings)
    for _ in runner.run():
        pass
    origin = runner.first_nonfinite
    text = _chosen(origin, default_loss)
    assert "Your script has no loss_fn, so GradScope's default MSE loss ran" in text
    assert "overflowed to Inf" in text
    assert "GradScope's default loss (your script has no loss_fn)" in origin.describe()


# -- forward values ---------------------------------------------------------------------------
def test_log_of_zero_evidence_input_minimum_zero():
    text = _chosen(_locate(lambda h: torch.log(torch.relu(h) * 0), torch.randn(3)), log_of_zero)
    assert "input minimum 0" in text


def test_log_of_negative_evidence_input_minimum_below_zero():
    origin = _locate(lambda h: torch.log(h - 10), torch.ones(3))
    assert "minimum -9" in _chosen(origin, log_of_negative)
    assert log_of_zero.hint(origin) is None


def test_root_of_negative_evidence_input_minimum_below_zero():
    origin = _locate(lambda h: torch.sqrt(h - 3), torch.ones(2))
    assert "minimum -2" in _chosen(origin, root_of_negative)


def test_reciprocal_of_zero_evidence_input_minimum_zero():
    origin = _locate(lambda h: torch.rsqrt(h * 0), torch.ones(2))
    assert "input minimum 0" in _chosen(origin, reciprocal_of_zero)


def test_division_evidence_zeros_on_both_sides_is_zero_over_zero():
    origin = _locate(lambda h: (h * 0) / (h * 0), torch.ones(3))
    text = _chosen(origin, division)
    assert "computed 0/0" in text and "3 exact zeros and the denominator 3" in text


def test_division_evidence_zeros_in_the_denominator_is_x_over_zero():
    origin = _locate(lambda h: h / (h * torch.tensor([1.0, 0.0])), torch.ones(2))
    text = _chosen(origin, division)
    assert "the denominator holds 1 exact zeros" in text and "0/0" not in text


def test_softmax_fully_masked_evidence_a_row_masked_for_every_key():
    def attention(h):
        scores = h[:, None] * h[None, :]
        keep = torch.ones(3, 3, dtype=torch.bool)
        keep[1] = False
        return torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1)

    text = _chosen(_locate(attention, torch.randn(3)), softmax_fully_masked)
    assert "-Inf for every key (batch index 1)" in text
    # the finite fill is not offered as harmless: those rows then attend to padding
    assert "Usual fix: make sure every query keeps at least one unmasked key" in text
    assert "attend evenly to padding" in text


class _PlusInfBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.tensor([math.inf, 0.0, 0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x + self.bias, dim=-1)


def test_softmax_of_inf_evidence_input_maximum_plus_inf():
    model = _PlusInfBias()
    origin = locate_first_nonfinite(model, lambda: model(torch.randn(2, 3)).sum())
    text = _chosen(origin, softmax_of_inf)
    assert "holds +Inf (max inf)" in text


def test_nonfinite_input_to_nan_evidence_minus_inf_mask_times_zero():
    # the additive mask is made before the step (no traced op wrote its -inf)
    additive = torch.tensor([0.0, -math.inf, 0.0])

    def masked_entropy(h):
        log_probs = torch.log_softmax(h + additive, dim=-1)
        return -(log_probs.exp() * log_probs)  # 0 * -inf at the masked token

    origin = _locate(masked_entropy, torch.randn(3))
    assert origin.kind == "nan"
    text = _chosen(origin, nonfinite_input_to_nan)
    assert "turned a -inf mask into NaN" in text and "multiplied by 0" in text
    assert "finfo" not in text  # a finite fill summed twice overflows again


def test_half_overflow_evidence_float16_output_from_inputs_below_65504():
    origin = _locate(lambda h: (h.half() * 300) * 300, torch.ones(2))
    text = _chosen(origin, half_overflow)
    assert "largest |input| 300" in text and "float32 would be fine" in text


def test_exp_overflow_evidence_input_142_above_float32_limit_88_7():
    origin = _locate(torch.exp, torch.tensor([1.0, 142.0]))
    text = _chosen(origin, exp_overflow)
    assert "largest input is 142" in text and "above 88.7" in text and "float32" in text
    half = _locate(torch.exp, torch.tensor([1.0, 12.0]).half(), torch.float16)
    text = _chosen(half, exp_overflow)
    assert (
        "above 11.1" in text
        and "float16" in text
        and "float32 would be fine (its limit is 88.7)" in text
    )


def test_loss_overflow_evidence_the_loss_op_went_inf_from_finite_values():
    model = nn.Linear(3, 1)
    origin = locate_first_nonfinite(model, lambda: (model(torch.ones(2, 3)) * 1e38 * 1e10).sum())
    assert origin.phase == "loss"
    assert "too large for its dtype" in _chosen(origin, loss_overflow)
    assert "reduction" not in origin.details["hint"]  # the loss has no reduction argument
    target = torch.zeros(2, 1)
    summed = locate_first_nonfinite(
        model, lambda: F.mse_loss(model(torch.ones(2, 3)) * 1e30, target, reduction="sum")
    )
    text = _chosen(summed, loss_overflow)
    assert "reduction='sum' adds every element's loss" in text


def test_overflow_evidence_inf_from_finite_inputs_not_an_exp():
    origin = _locate(lambda h: h * 1e30 * 1e30, torch.ones(2))
    text = _chosen(origin, overflow)
    assert "overflowed float32 to Inf from finite inputs (largest |input| 1e+30)" in text
    assert "exp" not in text


def test_overflow_of_a_product_advises_log_space_not_the_learning_rate():
    origin = _locate(lambda h: torch.cumprod(h * 1e10, 0), torch.ones(6))
    text = _chosen(origin, overflow)
    assert "compute it in log space" in text and "learning rate" not in text
    power = _chosen(_locate(lambda h: h**40, torch.full((2,), 10.0)), overflow)
    assert "x ** 40 of values up to 10 exceeds float32" in power


def test_outside_domain_evidence_acos_input_above_one():
    origin = _locate(lambda h: torch.acos(h * 1.5), torch.ones(2))
    text = _chosen(origin, outside_domain)
    assert "outside its domain [-1, 1] (min 1.5, max 1.5)" in text


def test_unsure_evidence_nan_from_finite_inputs_says_what_it_knows_and_stops():
    origin = _locate(lambda h: torch.erfinv(h * 2), torch.ones(2))
    assert origin.kind == "nan"
    text = hints.hint_for(origin)
    assert text == unsure.hint(origin) == origin.details["hint"]
    assert "made the first NaN from finite inputs" in text and "no rule" in text
    assert "overflow" not in text


# -- -inf masks -----------------------------------------------------------------------------
def _line(marker: str) -> int:
    lines = MASKED_VOCAB.read_text().splitlines()
    found = [number for number, text in enumerate(lines, 1) if marker in text]
    assert len(found) == 1
    return found[0]


def _vocab_batch():
    torch.manual_seed(0)
    return torch.randint(0, 6, (2, 5)), torch.randint(0, 6, (2, 5))


def test_mask_aggregated_evidence_label_smoothing_sums_a_masked_vocabulary():
    """The -inf mask over a restricted vocabulary is by design; -log_softmax carries it as
    +inf, and the smoothing sum over the vocabulary makes the +inf loss: that sum, in the
    model's forward, at its line, is the origin (not the loss, not Tensor.detach)."""
    model = RestrictedVocabSmoothedLM()
    tokens, labels = _vocab_batch()
    for batch in ((tokens, labels), None):
        origin = locate_first_nonfinite(model, lambda: model(tokens, labels), batch=batch)
        assert (origin.phase, origin.module, origin.kind, origin.op) == (
            "forward",
            "",
            "inf",
            "Tensor.sum",
        )
        assert origin.file == str(MASKED_VOCAB)
        assert origin.line == _line("# <- smoothing sum")
        text = _chosen(origin, mask_aggregated)
        assert "60 masked entries (now +inf)" in text
        assert "softmax, log_softmax or masked_fill consume it" in text


def test_a_minus_inf_mask_that_softmax_and_cross_entropy_consume_is_no_error():
    model = RestrictedVocabSafeLM()
    tokens, labels = _vocab_batch()
    assert math.isfinite(model(tokens, labels).item())
    assert locate_first_nonfinite(model, lambda: model(tokens, labels)) is None


def test_mask_aggregated_evidence_a_matrix_product_of_a_masked_matrix():
    class MaskedMix(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            keep = torch.tensor([True, True, False, True])
            scores = self.proj(x).masked_fill(~keep, -math.inf)
            return scores @ torch.ones(4, 2)  # <- the masked scores, not their softmax

    torch.manual_seed(0)
    model = MaskedMix()
    origin = locate_first_nonfinite(model, lambda: model(torch.randn(3, 4)).sum())
    assert (origin.phase, origin.module, origin.kind) == ("forward", "", "inf")
    assert "matmul" in origin.op and "<- the masked scores" in origin.code
    assert "3 masked entries (now -inf)" in _chosen(origin, mask_aggregated)


def test_mask_reached_loss_evidence_an_inf_no_traced_op_made():
    model = nn.Linear(3, 1)
    penalty = torch.tensor(math.inf)  # made outside the traced step
    origin = locate_first_nonfinite(model, lambda: model(torch.ones(2, 3)).sum() + penalty)
    assert origin.phase == "loss" and origin.details.get("propagated")
    text = _chosen(origin, mask_reached_loss)
    assert "already held Inf (min" in text and "no model layer made" in text


@pytest.mark.parametrize("masked_target", [False, True])
def test_a_masked_logit_at_the_target_is_made_by_the_cross_entropy(masked_target):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, target = torch.randn(2, 4), torch.tensor([0, 1])
    keep = torch.tensor([True, True, False])
    if masked_target:
        target = torch.tensor([0, 2])

    def compute_loss():
        return F.cross_entropy(model(x).masked_fill(~keep, -math.inf), target)

    origin = locate_first_nonfinite(model, compute_loss)
    if not masked_target:
        assert origin is None
        return
    assert (origin.phase, origin.kind, origin.op) == ("loss", "inf", "F.cross_entropy")
    # the evidence: the target of sample 1 is the masked class itself
    text = _chosen(origin, cross_entropy_masked_target)
    assert "1 of its targets (sample 1) is a class whose logit is -inf" in text
    assert "set them to ignore_index (-100)" in text


def test_mask_aggregated_evidence_addmm_reduces_its_matrices_not_its_bias():
    class AddmmMix(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4, 2))
            self.bias = nn.Parameter(torch.zeros(2))

        def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return torch.addmm(self.bias, x.masked_fill(~keep, -math.inf), self.weight)

    model = AddmmMix()
    x, keep = torch.randn(3, 4), torch.tensor([True, False, True, True])
    origin = locate_first_nonfinite(model, lambda: model(x, keep).sum())
    assert (origin.phase, origin.module, origin.kind, origin.op) == (
        "forward",
        "",
        "inf",
        "torch.addmm",
    )
    assert "3 masked entries (now -inf)" in _chosen(origin, mask_aggregated)
    # an additive -inf mask as addmm's first tensor is only added: no origin of its own
    mask = torch.zeros(3, 2).masked_fill(torch.tensor([[True, False]] * 3), -math.inf)
    scores = torch.addmm(mask, x, torch.ones(4, 2))
    assert torch.isinf(scores).sum() == 3
    weights = Wrapped(lambda h: torch.softmax(torch.addmm(mask, h, torch.ones(4, 2)), dim=-1))
    assert locate_first_nonfinite(weights, lambda: weights(x).sum()) is None


# -- hints that name the quantity, the dtype and the argument (#39) --------------------------
def test_fractional_power_of_negative_evidence_exponent_and_negative_base():
    for power, exponent in ((lambda h: h.pow(-0.5), "-0.5"), (lambda h: h**0.5, "0.5")):
        origin = _locate(power, torch.tensor([1.0, -2.0, 3.0]))
        text = _chosen(origin, fractional_power_of_negative)
        assert f"base minimum -2) to the fractional power {exponent}" in text
        assert ("not to 0: 0 to a negative power is Inf" in text) == (exponent == "-0.5")
    # an integer exponent of a negative base is fine
    assert _locate(lambda h: h.pow(2) * torch.tensor(math.inf), torch.tensor([-2.0])).op != (
        "Tensor.pow"
    )


def test_backward_divide_by_subnormal_evidence_xlogys_y_holds_a_subnormal():
    """xlogy(x, y) saves both operands; its y (saved as ``other``) holds 1e-40, which is not
    0 but whose reciprocal overflows float32. The hint quotes y, not the harmless x."""
    model = nn.Linear(3, 3)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3))
        model.bias.zero_()
    probs, target = torch.tensor([[1e-40, 0.5, 2.0]]), torch.tensor([[0.5, 0.25, 0.25]])
    origin = locate_first_nonfinite(model, lambda: -torch.xlogy(target, model(probs)).sum())
    assert (origin.phase, origin.kind) == ("backward", "inf")
    text = _chosen(origin, backward_divide_by_subnormal)
    assert "its saved other (the y of xlogy(x, y)): 1 of its values are subnormal" in text
    assert "smallest |value| 1e-40" in text and "smallest normal float32" in text
    assert "0.25" not in text  # the x it also saved is not the culprit


def test_backward_half_underflow_evidence_atan2_squares_below_float16():
    origin = _locate(
        lambda h: torch.atan2(h, h * 0.5), torch.tensor([1e-4, 2e-4, 1.0]).half(), torch.float16
    )
    assert (origin.phase, origin.kind) == ("backward", "inf")
    text = _chosen(origin, backward_half_underflow)
    assert "a^2 + b^2, which is 0 here only because it underflowed in float16" in text
    assert "torch.atan2(a.float(), b.float())" in text
    # the same values in float32 do not underflow
    model = Wrapped(lambda h: torch.atan2(h, h * 0.5))
    x = torch.tensor([1e-4, 2e-4, 1.0])
    assert locate_first_nonfinite(model, lambda: model(x).sum()) is None


class _MaskedScores(nn.Module):
    """Scores masked to -inf in the model's own forward, then weighted: the weight of 0 at a
    masked position makes 0 * -inf = NaN."""

    def __init__(self, factor: float | None = None) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.tensor([True, True, False, True])
        scores = self.proj(x).masked_fill(~keep, -math.inf)  # <- the deliberate mask
        if self.factor is not None:
            return (scores * self.factor).sum()
        return (scores * torch.tensor([1.0, 1.0, 0.0, 1.0])).sum()


def _marked_line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if marker in text)


def test_mask_made_nan_evidence_where_the_deliberate_minus_inf_was_written():
    torch.manual_seed(0)
    model = _MaskedScores()
    origin = locate_first_nonfinite(model, lambda: model(torch.randn(3, 4)))
    # the origin stays the op that made the NaN
    assert (origin.phase, origin.kind, origin.op) == ("forward", "nan", "Tensor.mul")
    text = _chosen(origin, mask_made_nan)
    line = _marked_line("# <- the deliberate mask")
    assert f"Tensor.masked_fill at {__file__}:{line}" in text
    assert "came in from outside" not in text
    assert "large finite value" in text and "loss weight/mask" in text


def test_zero_times_inf_evidence_a_python_zero_operand():
    torch.manual_seed(0)
    model = _MaskedScores(factor=0.0)
    origin = locate_first_nonfinite(model, lambda: model(torch.randn(3, 4)))
    text = _chosen(origin, zero_times_inf)
    assert "by the Python number 0.0 (argument arg1): 0 * Inf is NaN" in text
    assert "written on purpose by Tensor.masked_fill" in text
    assert origin.details["evidence"]["arguments"] == {"arg1": 0.0}


def test_root_of_cancellation_evidence_bfloat16_variance_by_subtraction():
    """E(h^2) - E(h)^2 under bfloat16 autocast: h is about 30 with a spread of about 0.5,
    so E(h^2) is about 900, whose bfloat16 rounding step (4) swamps the variance."""
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    with torch.no_grad():
        model.bias.fill_(30.0)
    x = torch.randn(8, 64)

    def compute_loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = model(x)
            variance = (h * h).mean(-1) - h.mean(-1) ** 2
            return variance.sqrt().float().sum()

    assert float(model(x).float().var(-1, unbiased=False).min()) > 0.1  # the true variance
    origin = locate_first_nonfinite(model, compute_loss)
    assert (origin.kind, origin.op) == ("nan", "Tensor.sqrt")
    text = _chosen(origin, root_of_cancellation)
    assert "ran in bfloat16 under bfloat16 autocast, which keeps 8 significant bits" in text
    assert "two passes" in text and "in float32" in text
    assert "Clamping at 0 only hides the rounding error" in text
    # a negative input that is not a difference of averages keeps the plain rule
    for negative in (lambda h: torch.sqrt(h - 3), lambda h: torch.sqrt(h.sum() - 10)):
        plain = _locate(negative, torch.ones(2))
        assert root_of_cancellation.hint(plain) is None


def test_root_of_cancellation_names_a_bfloat16_operand_of_a_float32_subtraction():
    """What CUDA autocast does (pow in float32, mean of a product in bfloat16): the
    subtraction runs in float32 but E(h^2) was rounded in bfloat16, the cause to name."""
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    with torch.no_grad():
        model.bias.fill_(30.0)
    x = torch.randn(8, 64)

    def compute_loss():
        h = model(x).bfloat16()
        variance = (h * h).mean(-1) - h.float().mean(-1) ** 2
        return variance.sqrt().float().sum()

    origin = locate_first_nonfinite(model, compute_loss)
    assert (origin.kind, origin.op) == ("nan", "Tensor.sqrt")
    text = _chosen(origin, root_of_cancellation)
    assert "took an operand computed in bfloat16, which keeps 8 significant bits" in text
    assert "in float32 (x.float())" in text


def test_cross_entropy_smoothing_over_mask_evidence_label_smoothing_argument():
    torch.manual_seed(0)
    model = nn.Linear(4, 5)
    keep = torch.tensor([True, True, True, False, False])
    x, target = torch.randn(3, 4), torch.tensor([0, 1, 2])

    def compute_loss(smoothing: float):
        masked = model(x).masked_fill(~keep, -math.inf)
        return F.cross_entropy(masked, target, label_smoothing=smoothing)

    origin = locate_first_nonfinite(model, lambda: compute_loss(0.1))
    assert (origin.kind, origin.op) == ("inf", "F.cross_entropy")
    text = _chosen(origin, cross_entropy_smoothing_over_mask)
    assert "label_smoothing=0.1 gives 0.1 of each target over all 5 classes" in text
    assert "6 masked logits" in text and "reduction='mean'" in text
    # the harmful remedy is named as such, never advised
    assert "Do not replace -inf by torch.finfo(dtype).min" in text
    assert torch.isfinite(compute_loss(0.0))  # without smoothing the same mask is fine
    # the harm the hint names, measured: finfo.min as the mask value with smoothing gives
    # ~7e36 for one row with one masked class, and Inf again once two such terms are summed
    keep = torch.arange(5) < 4
    for rows, low, high in ((1, 1e36, 1e38), (2, math.inf, math.inf)):
        filled = torch.randn(rows, 5).masked_fill(~keep, torch.finfo(torch.float32).min)
        target = torch.zeros(rows, dtype=torch.long)
        loss = float(F.cross_entropy(filled, target, label_smoothing=0.1))
        assert low <= loss <= high


def test_division_by_empty_count_evidence_an_integer_count_of_zero():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x, mask = torch.randn(3, 4), torch.zeros(3, dtype=torch.bool)
    origin = locate_first_nonfinite(model, lambda: (model(x).squeeze(-1) * mask).sum() / mask.sum())
    assert (origin.phase, origin.kind, origin.op) == ("loss", "nan", "Tensor.div")
    text = _chosen(origin, division_by_empty_count)
    assert "divided by a count that is 0 for this batch (an int64 tensor" in text
    assert "count.clamp(min=1)" in text and "Do not add an epsilon to the count" in text
    # a float denominator of 0.0 may be a std: the generic division rule, which no longer
    # advises an epsilon for a count
    spread = locate_first_nonfinite(model, lambda: (model(x) * 0).sum() / (model(x) * 0).std())
    text = _chosen(spread, division)
    assert "count.clamp(min=1)" in text


def test_bad_batch_lists_an_augmentation_that_made_the_nan():
    """A gamma augmentation (x ** 0.8) applied after normalisation made pixels below 0 NaN:
    the data loader, not the raw data, made it; the hint lists that cause."""
    torch.manual_seed(0)
    raw = torch.rand(4, 3, 8, 8)
    normalised = (raw - 0.5) / 0.25
    augmented = normalised**0.8  # NaN wherever normalisation made a pixel negative
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 2))
    target = torch.tensor([0, 1, 0, 1])
    origin = locate_first_nonfinite(
        model, lambda: F.cross_entropy(model(augmented), target), batch=(augmented, target)
    )
    text = _chosen(origin, bad_batch)
    assert "augmentation or transform that makes NaN from valid data" in text
    assert "a power or a log outside its domain" in text


def test_root_of_negative_evidence_rounding_in_hand_written_pairwise_distances():
    """|a|^2 + |b|^2 - 2 a.b is >= 0 exactly, but its diagonal rounds to -3e-5 among
    distances up to ~440: rounding noise, for which a clamp is the right fix."""
    torch.manual_seed(0)
    points = torch.randn(6, 16) * 3

    def distances(h):
        squares = (h * h).sum(-1)
        return torch.sqrt(squares[:, None] + squares[None, :] - 2 * h @ h.T)

    origin = _locate(distances, points)
    text = _chosen(origin, root_of_negative)
    assert "within float32's rounding of 0 for values up to 444" in text
    assert "x.clamp_min(1e-12)" in text
    # far from rounding (min -2 among values of 2): the clamp is not advised as the fix
    text = _chosen(_locate(lambda h: torch.sqrt(h - 3), torch.ones(2)), root_of_negative)
    assert "a clamp would hide the error" in text


def test_log_of_zero_from_a_softmax_names_log_softmax_as_the_usual_fix():
    origin = _locate(lambda h: torch.log(torch.softmax(h * 1000, -1)), torch.tensor([0.0, 1.0]))
    text = _chosen(origin, log_of_zero)
    assert "from torch.softmax, whose output underflowed to 0" in text
    assert "Use log_softmax on the logits" in text and "the usual fix" in text


def test_backward_root_at_zero_in_float16_advises_an_epsilon_float16_can_hold():
    origin = _locate(lambda h: torch.sqrt(h * 0), torch.ones(2, dtype=torch.float16), torch.float16)
    text = _chosen(origin, backward_root_at_zero)
    assert "eps = 1e-6, since 1e-12 rounds to 0 in float16" in text
    assert "compute it in float32" in text


def test_backward_of_discarded_nonfinite_evidence_where_kept_a_nan_branch():
    """torch.where(h > 0, sqrt(h), 0): the forward is finite, sqrt's backward at -1 is not."""
    origin = _locate(
        lambda h: torch.where(h > 0, torch.sqrt(h), torch.zeros_like(h)), torch.tensor([1.0, -1.0])
    )
    assert (origin.phase, origin.kind) == ("backward", "nan")
    text = _chosen(origin, backward_of_discarded_nonfinite)
    assert "its forward already made 1 NaN (in its saved result)" in text
    assert "torch.where(ok, torch.sqrt(torch.where(ok, x, 1)), 0)" in text
    assert "overflowed" not in text
    assert backward_large_derivative.hint(origin) is None  # it claims overflows: Inf only


@pytest.mark.parametrize(
    ("name", "fn", "values", "expected"),
    [
        ("atanh", torch.atanh, [0.5, 1.0], "atanh(+-1) is +-Inf, and its input reaches 1"),
        ("logit", torch.logit, [0.5, 1.0], "no eps was passed"),
        ("logit eps", lambda h: torch.logit(h, eps=0.0), [0.0, 0.5], "its eps argument is 0.0"),
        ("log1p", torch.log1p, [0.5, -1.0], "its input reaches -1, and it is -Inf at -1"),
        ("log1p below", torch.log1p, [0.5, -2.0], "it is NaN below -1"),
        ("inverse", lambda h: h.pow(-1), [0.5, 0.0], "raised 0 to the negative power -1"),
        ("inverse square", lambda h: h**-2, [0.5, 0.0], "raised 0 to the negative power -2"),
        ("lgamma", lambda h: torch.lgamma(h - 1), [2.0, 1.0], "poles at 0 and at every negative"),
    ],
)
def test_forward_domain_edge_evidence_an_edge_of_the_domain_is_no_overflow(
    name, fn, values, expected
):
    origin = _locate(fn, torch.tensor(values))
    text = _chosen(origin, forward_domain_edge)
    assert expected in text, name
    assert "overflowed" not in text and "learning rate" not in text


class _TwoAdditiveMasks(nn.Module):
    """A padding mask and a segment mask, each filled with finfo(float16).min and added:
    where both mask a key, -65504 + -65504 overflows to -inf, and a fully padded sample's
    rows become all -inf (NaN in softmax) instead of a uniform, finite attention."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pad: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ x.transpose(-1, -2)
        low = torch.finfo(scores.dtype).min
        padding = (1.0 - pad[:, None, :].to(scores.dtype)) * low
        segments = (1.0 - segment.to(scores.dtype)) * low
        return torch.softmax(scores + padding + segments, -1) @ x


def test_mask_value_overflow_evidence_two_finfo_min_masks_added_in_float16():
    torch.manual_seed(0)
    model = _TwoAdditiveMasks().half()
    x = torch.randn(2, 4, 8).half()
    pad = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])
    segment = torch.zeros(2, 4, 4)
    segment[0] = 1
    origin = locate_first_nonfinite(model, lambda: model(x, pad, segment).float().sum())
    assert (origin.kind, origin.op) == ("inf", "Tensor.add")
    text = _chosen(origin, mask_value_overflow)
    assert "torch.finfo(float16).min (or .max) exactly, -65504 in float16" in text
    assert "keep = keep_a & keep_b" in text and "learning rate" not in text


def test_cast_overflow_evidence_a_float16_conversion_of_values_above_65504():
    for cast in (lambda h: h.half(), lambda h: h.to(torch.float16)):
        origin = _locate(cast, torch.tensor([1.0, 1e5]))
        text = _chosen(origin, cast_overflow)
        assert "converted values up to 1e+05 to float16" in text
        assert "learning rate" not in text


def test_log_of_zero_of_a_softmax_picked_at_the_target_names_log_softmax():
    torch.manual_seed(0)
    model, x = nn.Linear(3, 4), torch.randn(2, 3) * 1000
    target = model(x).argmin(-1)  # the least likely class: its probability underflows

    def nll():
        return -torch.log(torch.softmax(model(x), -1).gather(1, target[:, None])).mean()

    text = _chosen(locate_first_nonfinite(model, nll), log_of_zero)
    assert "from torch.softmax (picked by Tensor.gather)" in text
    assert "Use log_softmax on the logits" in text


def test_log_of_zero_from_one_minus_sigmoid_names_logsigmoid():
    origin = _locate(lambda h: -torch.log(1 - torch.sigmoid(h * 100)), torch.tensor([1.0]))
    text = _chosen(origin, log_of_zero)
    assert "from 1 - sigmoid(x)" in text and "F.logsigmoid(-x)" in text


def test_unsure_lists_the_evidence_and_advises_nothing():
    origin = _locate(lambda h: torch.erfinv(h * 2), torch.ones(2))
    text = _chosen(origin, unsure)
    assert "What was recorded: input 0 float32 in [2, 2]." in text
    for advice in ("epsilon", "clamp", "learning rate", "GradScaler"):
        assert advice not in text


# -- #35: the hints on a blow-up, a BatchNorm, the batch and mixed precision -------------------
class _TinyAttentionLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        mixed, _ = self.attention(h, h, h, need_weights=False)
        return self.head(h + mixed)


def test_backward_overflow_of_large_values_evidence_exploded_weights_in_attention():
    """Weights 300x too large (what a learning rate blow-up leaves): the loss is finite
    (about 3e9) but the attention's backward overflows its huge saved values into NaN."""
    torch.manual_seed(0)
    model = _TinyAttentionLM()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(300)
    tokens = torch.randint(0, 16, (4, 12))

    def compute_loss():
        return F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())

    assert 1e8 < float(compute_loss()) < 1e12
    origin = locate_first_nonfinite(model, compute_loss)
    assert (origin.phase, origin.kind, origin.module) == ("backward", "nan", "attention")
    text = _chosen(origin, backward_overflow_of_large_values)
    assert "the values it saved from the forward reach" in text
    assert "learning rate is too high" in text
    assert "derivative is undefined" not in text


def test_batch_norm_overflow_never_quotes_running_var_as_the_largest_input():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    with torch.no_grad():
        model[1].running_var.fill_(1e36)
        model[1].weight.fill_(1e30)
    x = torch.randn(8, 4) * 1e30
    origin = locate_first_nonfinite(model, lambda: model(x).sum())
    assert (origin.module, origin.op) == ("1", "F.batch_norm")
    inputs = origin.details["values"]["inputs"]
    assert {"1.running_mean", "1.running_var"} <= {v.get("name") for v in inputs}
    text = _chosen(origin, overflow)
    largest = float(text.split("largest |input| ")[1].split(")")[0])
    assert largest < 1e31  # the layer's input, not running_var's 1e36


def test_the_input_origin_does_not_repeat_itself():
    model = nn.Linear(4, 1)
    x, target = torch.randn(5, 4), torch.randn(5, 1)
    x[3, 1] = math.nan
    origin = locate_first_nonfinite(model, lambda: F.mse_loss(model(x), target), batch=(x, target))
    described = origin.describe()
    assert described.count("batch") == 1, described
    assert "inputs holds 1 NaN in sample 3" in described
    assert origin.details["hint"].count("in the batch") == 1


def test_half_overflow_under_autocast_with_a_scaler_advises_neither():
    import gradscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    with torch.no_grad():
        model[0].weight.fill_(200.0)
        model[1].weight.fill_(200.0)
    x = torch.full((2, 4), 1.0)
    scaler = torch.amp.GradScaler("cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    watch = gradscope.watch(model, scaler=scaler, optimizer=optimizer)

    def compute_loss():
        with torch.autocast("cpu", dtype=torch.float16):
            return model(x).float().mean()

    loss = compute_loss()
    scaler.scale(loss).backward()
    stats = watch.collect(loss, locate=compute_loss)
    origin = stats.origin
    assert origin is not None and origin.details.get("loss_scaler")
    assert origin.details["evidence"]["autocast"] == "float16"
    text = _chosen(origin, half_overflow)
    assert "already uses autocast and a GradScaler" in text
    assert "with GradScaler" not in text
    # the same origin without a scaler or autocast gets the usual advice
    origin.details.pop("loss_scaler")
    origin.details["evidence"].pop("autocast")
    assert "autocast (which keeps overflow-prone ops in float32) with GradScaler" in (
        half_overflow.hint(origin)
    )
