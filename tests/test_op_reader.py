"""The early warnings' op-level reader (#37): attention logits inside SDPA,
nn.MultiheadAttention and transformers attention, and exp inputs in parameter-free modules,
read on due steps only and named after the innermost running module."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import gradscope
from gradscope.core.runner import StepRunner
from gradscope.core.sources import load_with_settings
from gradscope.core.warnings import schedule
from gradscope.core.warnings.op_reader import (
    ATTENTION_LOGIT,
    EXP_INPUT,
    OpReader,
    attention_max_logit,
    op_observations,
)
from tests.models.drift_cases import OP_CASES, OP_LOOK_ALIKES, run_watched

LEAD = 20
SAMPLE = Path(__file__).resolve().parent.parent / "sample_models"
SAMPLE = SAMPLE / "half_precision_attention_overflow.py"


def _read(model: nn.Module, *inputs, **kwargs) -> dict[tuple[str, str], float]:
    reader = OpReader()
    reader.arm(model, model)
    model(*inputs, **kwargs)
    return {(o.module, o.quantity): o.value for o in op_observations(reader.take())}


def test_sdpa_max_logit_with_masks_against_the_logits_by_hand():
    torch.manual_seed(0)
    query, key = torch.randn(3, 2, 5, 8), torch.randn(3, 2, 7, 8)
    logits = query[0] @ key[0].transpose(-2, -1) / math.sqrt(8)
    assert attention_max_logit(query, key).item() == pytest.approx(logits.max().item(), rel=1e-6)
    allowed = torch.rand(5, 7) > 0.5
    allowed[:, 0] = True
    masked = logits.masked_fill(~allowed, -math.inf).max().item()
    assert attention_max_logit(query, key, allowed).item() == pytest.approx(masked, rel=1e-6)
    causal = logits[:, :, :5].masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
    square = attention_max_logit(query, key[:, :, :5], is_causal=True).item()
    assert square == pytest.approx(causal.max().item(), rel=1e-6)
    assert attention_max_logit(query, key, scale=1.0).item() == pytest.approx(
        (query[0] @ key[0].transpose(-2, -1)).max().item(), rel=1e-6
    )


class _InlineSoftmax(nn.Module):
    """No parameters of its own: exp and a softmax written in its forward."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.exp() / torch.exp(scores).sum(-1, keepdim=True) + F.softmax(scores, -1)


class _Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(4, 6)
        self.inline = _InlineSoftmax()
        self.mha = nn.MultiheadAttention(6, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.project(x)
        return self.inline(scores).sum() + self.mha(scores, scores, scores)[0].sum()


def test_exp_and_softmax_are_named_after_the_parameter_free_module_and_results_unchanged():
    torch.manual_seed(0)
    model = _Holder()
    x = torch.randn(2, 3, 4)
    plain = model(x)
    figures = _read(model, x)
    scores = model.project(x).detach()
    assert figures[("inline", EXP_INPUT)] == pytest.approx(scores.max().item(), rel=1e-6)
    assert figures[("inline", ATTENTION_LOGIT)] == pytest.approx(scores.max().item(), rel=1e-6)
    # nn.MultiheadAttention: q k^T / sqrt(head width) of the first element, by hand
    weight, bias = model.mha.in_proj_weight.detach(), model.mha.in_proj_bias.detach()
    q = (scores[0] @ weight[:6].T + bias[:6]).view(3, 2, 3).transpose(0, 1)
    k = (scores[0] @ weight[6:12].T + bias[6:12]).view(3, 2, 3).transpose(0, 1)
    expected = (q @ k.transpose(-2, -1) / math.sqrt(3)).max().item()
    assert figures[("mha", ATTENTION_LOGIT)] == pytest.approx(expected, rel=1e-5)
    # the reader changes nothing, is gone after the step, and reads nothing under no_grad
    assert torch.equal(model(x), plain)
    assert not model._forward_hooks and not model._forward_pre_hooks
    with torch.no_grad():
        assert _read(model, x) == {}


def test_the_reader_runs_only_on_due_steps_and_skips_a_compiled_model(recwarn):
    torch.manual_seed(0)
    model = _Holder()
    x = torch.randn(2, 3, 4)
    armed = []
    # the early warnings' schedule: every step of the first DENSE_STEPS, then every 3rd
    steps = range(schedule.DENSE_STEPS - 2, schedule.DENSE_STEPS + 6)
    with gradscope.watch(model, early_warnings=True, detail_every=3) as watch:
        watch.step = steps[0]
        for _ in steps:
            armed.append(bool(model._forward_pre_hooks))
            loss = model(x)
            loss.backward()
            watch.collect(loss)
    assert armed == [schedule.due(step, 3) for step in steps]
    assert armed == [True, True, False, False, True, False, False, True]
    assert not model._forward_pre_hooks and not model._forward_hooks
    compiled = torch.compile(_Holder(), backend="eager")
    recwarn.clear()
    with gradscope.watch(compiled, early_warnings=True, detail_every=1) as watch:
        loss = compiled(x)
        loss.backward()
        watch.collect(loss)
    assert watch._op_reader.skipped == "the model is compiled (torch.compile): its ops are not read"
    assert any("not read: the model is compiled" in str(w.message) for w in recwarn)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_half_precision_attention_sample_warns_before_its_inf(seed):
    """Seed 0, the sample's own, gives no drift and no value within the fixed margin: its exp
    input swings (7.58 at step 17 after rises of up to 1.8) and jumps to 11.8 at step 21.
    The swing rule (two such rises cross float16 exp's 11.09) warns at step 17."""
    torch.set_num_threads(1)
    loaded, settings = load_with_settings(str(SAMPLE), {"seed": seed})
    settings.early_warnings = True
    runner = StepRunner(loaded, settings)
    try:
        results = list(runner.run())
    finally:
        runner.close()
    failed_at = results[-1].step
    assert results[-1].nonfinite, "the sample did not fail"
    warnings = runner.watch.early_warnings.warnings
    assert warnings, f"no warning before the Inf at step {failed_at}"
    first = warnings[0]
    assert (first.module, first.quantity, first.kind) == (
        "encoder.attention",
        EXP_INPUT,
        "low headroom",
    )
    assert first.step < failed_at and first.limit == pytest.approx(11.09, abs=0.01)
    assert "subtract the row maximum" in first.hint


def test_the_sample_through_gradscope_watch_reads_encoder_attention():
    """Seed 0 (the sample's own): the exp input is read every step (it reaches 11.8 at
    step 21, from 6.96 at step 20)."""
    import runpy

    script = runpy.run_path(str(SAMPLE))
    torch.manual_seed(0)
    model = script["build_model"]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []
    with gradscope.watch(model, early_warnings=True, detail_every=1) as watch:
        for _ in range(5):
            tokens, labels = script["make_batch"](16, torch.device("cpu"))
            loss = script["loss_fn"](model(tokens), labels)
            optimizer.zero_grad()
            loss.backward()
            watch.collect(loss)
            seen.append([(f.module, f.quantity, f.dtype) for f in watch._op_figures])
            optimizer.step()
    assert seen == [[]] * 5  # taken and consumed by each collect
    series = watch.early_warnings._series[("encoder.attention", EXP_INPUT)]
    assert len(series.values) == 5 and all(3 < v < 9.7 for v in series.values)


@pytest.mark.parametrize("case", OP_CASES, ids=lambda case: case.name)
def test_each_attention_case_warns_ahead_naming_the_attention_module(case):
    run, watch = run_watched(case, detail_every=1, early_warnings=True)
    assert run.failed_at is not None and 60 <= run.failed_at <= 400, run.failed_at
    logits = [w for w in watch.early_warnings.warnings if w.quantity == ATTENTION_LOGIT]
    assert logits, [w.describe() for w in watch.early_warnings.warnings]
    assert logits[0].module in case.precursors
    assert logits[0].step <= run.failed_at - LEAD, (logits[0].describe(), run.failed_at)
    assert "qk-layernorm" in logits[0].hint


@pytest.mark.parametrize("case", OP_LOOK_ALIKES, ids=lambda case: case.name)
def test_no_attention_look_alike_warns(case):
    run, watch = run_watched(case, detail_every=1, early_warnings=True)
    assert run.failed_at is None
    assert [w.describe() for w in watch.early_warnings.warnings] == []


# -- transformers ------------------------------------------------------------------------


def _tiny(kind: str, attention: str) -> tuple[nn.Module, str]:
    transformers = pytest.importorskip("transformers")
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4, attn_pdrop=0.0
        )
        name = "transformer.h.0.attn"
    else:
        config = transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=16,
        )
        name = "model.layers.0.self_attn"
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    return model, name


def _logits_by_hand(kind: str, module: nn.Module, hidden: torch.Tensor, kwargs) -> float:
    """max(q k^T * scale) under the causal mask, from the attention module's own input."""
    if kind == "gpt2":
        q, k, _ = module.c_attn(hidden).split(module.embed_dim, dim=2)
        shape = (*hidden.shape[:-1], module.num_heads, module.head_dim)
        q, k = q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2)
    else:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

        shape = (*hidden.shape[:-1], -1, module.head_dim)
        q = module.q_proj(hidden).view(shape).transpose(1, 2)
        k = module.k_proj(hidden).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *kwargs["position_embeddings"])
        k = repeat_kv(k, module.num_key_value_groups)
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    length = logits.shape[-1]
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    return logits.masked_fill(future, -math.inf).max().item()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_transformers_attention_is_read_and_named(kind, attention):
    model, name = _tiny(kind, attention)
    module = model.get_submodule(name)
    seen = {}

    def keep(module, args, kwargs):
        seen["hidden"] = (args[0] if args else kwargs["hidden_states"]).detach()
        seen["kwargs"] = kwargs

    handle = module.register_forward_pre_hook(keep, with_kwargs=True)
    tokens = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    figures = _read(model, tokens)
    handle.remove()
    with torch.no_grad():
        expected = _logits_by_hand(kind, module, seen["hidden"], seen["kwargs"])
    assert math.isfinite(figures[(name, ATTENTION_LOGIT)])
    assert figures[(name, ATTENTION_LOGIT)] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # a short healthy run gives no warning
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(2)
    with gradscope.watch(model, early_warnings=True, detail_every=1) as watch:
        for _ in range(60):
            batch = torch.randint(0, 64, (4, 12), generator=generator)
            loss = model(batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            watch.collect(loss)
            optimizer.step()
    assert watch.early_warnings._series[(name, ATTENTION_LOGIT)].values
    assert [w.describe() for w in watch.early_warnings.warnings] == []


def test_under_autocast_the_logit_is_read_in_float32_against_float16s_limit():
    """nn.MultiheadAttention under float16 autocast: its q k^T runs in float16 (scaled q
    first); the reader's own matmul runs with autocast off, so a logit of 40,000, whose
    unscaled q k^T (69,000) float16 cannot hold, is read as it is."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(6, 2, batch_first=True, bias=False)
    with torch.no_grad():
        mha.in_proj_weight.zero_()
        mha.in_proj_weight[:6].fill_(1.0)
        mha.in_proj_weight[6:12].fill_(1.0)
    x = torch.full((1, 2, 6), math.sqrt(40000 * math.sqrt(3) / 6 / 6 / 3))
    expected = ((6 * x[0, 0, 0]) ** 2 * 3 / math.sqrt(3)).item()  # q = k = 6x, head width 3
    assert expected == pytest.approx(40000, rel=1e-3)
    reader = OpReader()
    reader.arm(mha, mha)
    with torch.autocast("cpu", dtype=torch.float16):
        mha(x, x, x)
    (observation,) = op_observations(reader.take())
    assert (observation.quantity, observation.dtype) == (ATTENTION_LOGIT, torch.float16)
    assert observation.value == pytest.approx(expected, rel=1e-5)
