"""Small CPU trainings that drift for tens of steps before they fail, and their healthy twins (#37).

Each failing case ends in a NaN/Inf loss, or a loss ten times the median of its first 20 steps,
after 60-400 steps; one core trains any of them in a few seconds. Its look-alike is the same
model and data with the fix practice applies (qk-layernorm, z-loss, a lower learning rate) and
trains all its steps healthily. ``precursors`` names the modules (``named_modules()`` names)
whose outputs show the drift before the failure. Steps at which each case fails with these
seeds (torch 2.14.1, one thread): attention_logit_growth 231, lm_head_log_partition 128,
half_residual_stream 102, warmup_too_high 81.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import gradscope

FAILURE_FACTOR = 10.0  # a loss this many times its early median counts as a failure
EARLY_STEPS = 20


@dataclass
class Training:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None


@dataclass(frozen=True)
class DriftCase:
    name: str
    build: Callable[[], Training]
    fails: bool
    precursors: tuple[str, ...] = ()


@dataclass
class CaseRun:
    losses: list[float] = field(default_factory=list)
    failed_at: int | None = None


def run_case(
    case: DriftCase,
    steps: int = 400,
    after_step: Callable[[int, nn.Module, float], None] | None = None,
    before_step: Callable[[int, Training], None] | None = None,
    after_backward: Callable[[torch.Tensor], None] | None = None,
    seed: int = 0,
) -> CaseRun:
    """Train ``case`` for ``steps`` steps on one thread, stopping at its failure.
    ``before_step``, ``after_backward`` (given the loss: ``watch.collect``) and
    ``after_step`` let a test watch the model."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)  # the initial weights; the data's generators are the case's own
    training = case.build()
    result = CaseRun()
    for step in range(steps):
        if before_step is not None:
            before_step(step, training)
        inputs, targets = training.batch()
        loss = training.loss(training.model(inputs), targets)
        training.optimizer.zero_grad()
        loss.backward()
        if after_backward is not None:
            after_backward(loss)
        training.optimizer.step()
        if training.scheduler is not None:
            training.scheduler.step()
        value = loss.item()
        result.losses.append(value)
        if after_step is not None:
            after_step(step, training.model, value)
        if _failed(result.losses):
            result.failed_at = step
            break
    return result


def run_watched(
    case: DriftCase, steps: int = 400, seed: int = 0, **options: Any
) -> tuple[CaseRun, Any]:
    """``run_case`` under ``gradscope.watch(model, **options)`` made at its first step,
    collected after each backward: the run and the (closed) watch."""
    made: list[Any] = []

    def before(step: int, training: Training) -> None:
        if not made:
            made.append(gradscope.watch(training.model, optimizer=training.optimizer, **options))

    try:
        run = run_case(
            case,
            steps,
            before_step=before,
            after_backward=lambda loss: made[0].collect(loss),
            seed=seed,
        )
    finally:
        if made:
            made[0].close()
    return run, made[0]


def _failed(losses: list[float]) -> bool:
    if not math.isfinite(losses[-1]):
        return True
    if len(losses) <= EARLY_STEPS:
        return False
    early = sorted(losses[:EARLY_STEPS])[EARLY_STEPS // 2]
    return losses[-1] > FAILURE_FACTOR * early


# --- attention logit growth: a causal LM at a high learning rate, scores in float16 ----------

VOCAB = 64
WIDTH = 64
HEADS = 4
LENGTH = 32


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))


class QueryKeyScores(nn.Module):
    """The attention logits q k^T / sqrt(d) of one fused query-key projection (its own
    weight), computed in float16 as autocast does on a GPU; the softmax after it is float32.
    ``qk_norm``: a LayerNorm on each head's queries and keys (qk-layernorm)."""

    def __init__(self, qk_norm: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(2 * WIDTH, WIDTH))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(2 * WIDTH))
        head_width = WIDTH // HEADS
        self.q_norm = nn.LayerNorm(head_width) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head_width) if qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        query_key = F.linear(x, self.weight, self.bias).view(batch, length, 2, HEADS, -1)
        query, key = query_key.permute(2, 0, 3, 1, 4)
        query, key = self.q_norm(query), self.k_norm(key)
        scaled = query * query.shape[-1] ** -0.5
        return scaled.half() @ key.half().transpose(-2, -1)


class CausalSelfAttention(nn.Module):
    def __init__(self, qk_norm: bool) -> None:
        super().__init__()
        self.scores = QueryKeyScores(qk_norm)
        self.value = nn.Linear(WIDTH, WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        scores = self.scores(x).float()
        value = self.value(x).view(batch, length, HEADS, -1).transpose(1, 2)
        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        return self.proj((weights @ value).transpose(1, 2).reshape(batch, length, width))


class TransformerBlock(nn.Module):
    def __init__(self, qk_norm: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attn = CausalSelfAttention(qk_norm)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(nn.Module):
    def __init__(self, qk_norm: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(LENGTH, WIDTH) * 0.02)
        self.blocks = nn.Sequential(TransformerBlock(qk_norm), TransformerBlock(qk_norm))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def _markov_batches(batch_size: int = 16) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """Sequences of a fixed random Markov chain: learnable, with some entropy left."""
    transitions = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(5))
    transitions = (transitions * 3).softmax(-1)
    generator = torch.Generator().manual_seed(1)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = [torch.randint(0, VOCAB, (batch_size,), generator=generator)]
        for _ in range(LENGTH):
            tokens.append(torch.multinomial(transitions[tokens[-1]], 1, generator=generator)[:, 0])
        sequence = torch.stack(tokens, 1)
        return sequence[:, :-1], sequence[:, 1:]

    return batch


def _next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _attention_training(qk_norm: bool, lr: float) -> Callable[[], Training]:
    def build() -> Training:
        model = TinyCausalLM(qk_norm)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.95))
        return Training(model, optimizer, _markov_batches(), _next_token_loss)

    return build


# --- LM head without z-loss: the log-partition drifts until exp overflows in float16 ---------


class HalfHead(nn.Linear):
    """The output head computed in float16, as autocast does on a GPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.half(), self.weight.half(), self.bias.half())


class BigramLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mlp = _mlp()
        self.head = HalfHead(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        return self.head(hidden + self.mlp(hidden))


def _half_softmax_loss(z_loss: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy written out in the logits' dtype (exp, sum, log), plus z-loss:
    ``z_loss * logsumexp(logits)**2`` keeps the log-partition near 0 (PaLM's fix)."""

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        log_partition = logits.exp().sum(-1, keepdim=True).log()
        log_probability = (logits - log_partition).gather(1, targets[:, None]).float()
        penalty = logits.float().logsumexp(-1).pow(2).mean()
        return -log_probability.mean() + z_loss * penalty

    return loss


def _lm_head_training(z_loss: float) -> Callable[[], Training]:
    def build() -> Training:
        model = BigramLM()
        optimizer = torch.optim.Adam(model.parameters(), lr=1.5e-3)
        successor = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))
        generator = torch.Generator().manual_seed(1)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            tokens = torch.randint(0, VOCAB, (32,), generator=generator)
            return tokens, successor[tokens]

        return Training(model, optimizer, batch, _half_softmax_loss(z_loss))

    return build


# --- a residual stream: float16 growing to its overflow; a warm-up to too high a rate -------

FEATURES = 32
CLASSES = 10


class ResidualBlock(nn.Module):
    """x + down(gelu(up(norm(x)))), the down projection its own weight, so that the block,
    whose output is the residual stream, is a layer the watch sees."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.weight = nn.Parameter(torch.empty(WIDTH, 4 * WIDTH))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.gelu(self.up(self.norm(x.float()))), self.weight, self.bias)
        return x + update.to(x.dtype)


class ResidualClassifier(nn.Module):
    """Pre-norm residual MLP; ``stream_dtype`` is the residual stream's (float16 as in a
    model whose activations are kept in half precision)."""

    def __init__(self, stream_dtype: torch.dtype) -> None:
        super().__init__()
        self.stream_dtype = stream_dtype
        self.inp = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.Sequential(*[ResidualBlock() for _ in range(4)])
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = self.blocks(self.inp(x).to(self.stream_dtype))
        return self.head(self.norm(stream.float()))


def _residual_training(
    stream_dtype: torch.dtype, lr: float, warmup: int = 0
) -> Callable[[], Training]:
    def build() -> Training:
        model = ResidualClassifier(stream_dtype)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        scheduler = None
        if warmup:
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: min(1.0, (step + 1) / warmup)
            )
        prototypes = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(4))
        generator = torch.Generator().manual_seed(1)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            labels = torch.randint(0, CLASSES, (64,), generator=generator)
            noise = torch.randn(64, FEATURES, generator=generator) * 2
            return prototypes[labels] + noise, labels

        return Training(model, optimizer, batch, F.cross_entropy, scheduler)

    return build


_BLOCKS = ("blocks.0", "blocks.1", "blocks.2", "blocks.3", "inp")

CASES = (
    DriftCase(
        "attention_logit_growth",
        _attention_training(qk_norm=False, lr=0.1),
        fails=True,
        # The scores module returns the logits; the op-level reader sees the same logits
        # at the softmax in its parent, the attention module.
        precursors=(
            "blocks.0.attn.scores",
            "blocks.1.attn.scores",
            "blocks.0.attn",
            "blocks.1.attn",
        ),
    ),
    DriftCase("lm_head_log_partition", _lm_head_training(z_loss=0.0), True, ("head",)),
    DriftCase("half_residual_stream", _residual_training(torch.float16, 0.2), True, _BLOCKS),
    DriftCase("warmup_too_high", _residual_training(torch.float32, 1.0, warmup=100), True, _BLOCKS),
)

LOOK_ALIKES = (
    DriftCase("attention_qk_layernorm", _attention_training(qk_norm=True, lr=0.03), False),
    DriftCase("lm_head_z_loss", _lm_head_training(z_loss=0.1), False),
    DriftCase("half_residual_lower_lr", _residual_training(torch.float16, 0.02), False),
    DriftCase("warmup_lower_peak", _residual_training(torch.float32, 0.01, warmup=100), False),
)


# --- attention logits inside one call: F.scaled_dot_product_attention, nn.MultiheadAttention --
# No module returns the scores: the watch reads them from the op (gradscope.core.warnings.
# op_reader). Float32 throughout; at a high learning rate without qk-layernorm the logits
# grow; the attention runs in float16 (as autocast runs it on a GPU), where the logits
# overflow.


class FusedSelfAttention(nn.Module):
    """Causal self-attention through ``F.scaled_dot_product_attention``; ``qk_norm``: a
    LayerNorm on each head's queries and keys."""

    def __init__(self, qk_norm: bool) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        head_width = WIDTH // HEADS
        self.q_norm = nn.LayerNorm(head_width) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head_width) if qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        qkv = self.qkv(x).view(batch, length, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        query, key, value = self.q_norm(qkv[0]), self.k_norm(qkv[1]), qkv[2]
        # float16, as autocast runs it on a GPU
        out = F.scaled_dot_product_attention(query.half(), key.half(), value.half(), is_causal=True)
        return self.proj(out.float().transpose(1, 2).reshape(batch, length, width))


class TorchAttention(nn.Module):
    """``nn.MultiheadAttention`` with a causal mask (its weights asked for, as by default),
    under float16 autocast: its projections and q k^T in float16, its softmax in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        with torch.autocast(x.device.type, dtype=torch.float16):
            out = self.mha(x, x, x, attn_mask=future)[0]
        return out.float()


class OpAttentionBlock(nn.Module):
    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.attn = attention
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class OpAttentionLM(nn.Module):
    def __init__(self, attention: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(LENGTH, WIDTH) * 0.02)
        self.blocks = nn.Sequential(OpAttentionBlock(attention()), OpAttentionBlock(attention()))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def _op_attention_training(
    attention: Callable[[], nn.Module], lr: float, warmup: int = 0
) -> Callable[[], Training]:
    def build() -> Training:
        model = OpAttentionLM(attention)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.95))
        scheduler = None
        if warmup:
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: min(1.0, (step + 1) / warmup)
            )
        return Training(model, optimizer, _markov_batches(), _next_token_loss, scheduler)

    return build


def _fused_attention() -> nn.Module:
    return FusedSelfAttention(qk_norm=False)


# The attention modules the op-level reader names (the module whose forward calls SDPA, and
# nn.MultiheadAttention itself). Steps at which they fail with seed 0 (torch 2.14.1, one
# thread): sdpa_warmup_too_high 132, multihead_attention_float16 220.
OP_CASES = (
    DriftCase(
        "sdpa_warmup_too_high",
        _op_attention_training(_fused_attention, 0.5, warmup=100),
        fails=True,
        precursors=("blocks.0.attn", "blocks.1.attn"),
    ),
    DriftCase(
        "multihead_attention_float16",
        _op_attention_training(TorchAttention, 0.1),
        fails=True,
        precursors=("blocks.0.attn.mha", "blocks.1.attn.mha"),
    ),
)

OP_LOOK_ALIKES = (
    DriftCase(
        "sdpa_qk_layernorm",
        _op_attention_training(lambda: FusedSelfAttention(qk_norm=True), 0.05, warmup=100),
        False,
    ),
    DriftCase("multihead_attention_lower_lr", _op_attention_training(TorchAttention, 0.01), False),
)
