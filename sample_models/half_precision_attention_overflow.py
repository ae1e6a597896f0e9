"""Half-precision overflow: a hand-written softmax that float32 tolerates and float16 does not.

A small sequence classifier is converted to float16 (``model.half()``) to save memory. Its
``SelfAttention`` computes the attention weights by hand, ``exp(scores) / exp(scores).sum()``,
without subtracting the row maximum first. float16's largest finite value is 65504, so
``exp`` overflows as soon as a score exceeds about 11.1 (float32 would only overflow above
88.7). As training sharpens the attention the scores grow past 11, ``exp`` gives Inf and
``Inf / Inf`` gives NaN in the attention output. The very same script in float32 (call
``build_model(torch.float32)``) trains for all its steps without any NaN/Inf.

GradScope should report: healthy steps with a falling loss, then, between steps 10 and 30
(step 21 with the default seed 0), first Inf in the forward pass, module
``encoder.attention`` (the custom module), output, op ``Tensor.exp`` on float16 inputs at the
``exp`` line of ``SelfAttention.forward`` (the module's output is NaN: Inf / Inf); every layer
"nonfinite" at that step and the run halted there. With early warnings on, a "low headroom"
warning comes first (step 17 with seed 0): the exp input swings by up to 1.8 a step and sits
3.5 below float16's overflow. In float32 the same 30 steps are finite.
Fix: ``torch.softmax(scores, dim=-1)`` (it subtracts the maximum), or compute the softmax in
float32 (``scores.float().softmax(-1).to(scores.dtype)``), or use autocast, which does so.
"""

import torch
from torch import nn
from torch.nn import functional as F

CONFIG = {"steps": 30, "batch_size": 16, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9}

VOCAB = 50
LENGTH = 12
DIM = 32
CLASSES = 3
EMBED_SCALE = 2.0  # embeddings scaled up, as many transformer implementations do


class SelfAttention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.scale = dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ self.key(x).transpose(1, 2) * self.scale
        weights = scores.exp()
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights @ self.value(x)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = SelfAttention(DIM)
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.attention(x))


class SequenceClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.encoder = Encoder()
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) * EMBED_SCALE
        return self.head(self.encoder(x).mean(dim=1))


def build_model(dtype: torch.dtype = torch.float16) -> nn.Module:
    return SequenceClassifier().to(dtype)


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, CLASSES, (batch_size,), device=device)
    tokens = torch.randint(0, VOCAB, (batch_size, LENGTH), device=device)
    topical = torch.rand(batch_size, LENGTH, device=device) < 0.5
    # half of the tokens come from the vocabulary range of the sequence's class
    per_class = VOCAB // CLASSES
    tokens = torch.where(topical, tokens % per_class + labels[:, None] * per_class, tokens)
    return tokens, labels


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)
