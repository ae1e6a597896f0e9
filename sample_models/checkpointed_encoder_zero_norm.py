"""Activation checkpointing does not move the diagnosis: a backward NaN inside a checkpointed
block is found at the same module, op and line as without checkpointing.

A small retrieval encoder projects its token embeddings (no bias) and L2-normalises them with a
hand-written length, ``x.pow(2).sum(-1).sqrt()``, guarded by ``clamp_min`` so the forward never
divides by 0. Padding tokens embed to exact zeros (``padding_idx``), so their projection is 0
and its length 0: the forward is finite, but ``clamp_min`` sends a zero gradient into a
``sqrt`` whose derivative at 0 is infinite, and the backward computes 0/0 = NaN, which reaches
the projection's weight. The blocks run under ``torch.utils.checkpoint`` (non-reentrant,
the recommended form), which recomputes them during backward.

GradScope should report: step 0, finite loss, first **NaN** in the **backward** pass, module
``encoder.normalize``, input grad, op ``Tensor.sqrt`` backward, at the ``.sqrt()`` line, with
a hint that sqrt's derivative is infinite at 0; ``encoder.project`` nonfinite, the layers after
the normalisation ok; the same origin with ``build_model(checkpointing=False)`` and with the
reentrant form (``build_model(reentrant=True)``).
Fix: ``torch.nn.functional.normalize(x, dim=-1)``, or ``(x.pow(2).sum(-1) + 1e-12).sqrt()``.
"""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CONFIG = {"steps": 5, "batch_size": 8, "optimizer": "adam", "lr": 1e-3}

VOCAB = 40
LENGTH = 6
DIM = 16


class Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.pow(2).sum(dim=-1, keepdim=True).sqrt()
        return x / length.clamp_min(1e-6)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(DIM, DIM, bias=False)
        self.normalize = Normalize()
        self.mix = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU(), nn.Linear(DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(self.normalize(self.project(x)))


class Retriever(nn.Module):
    def __init__(self, checkpointing: bool = True, reentrant: bool = False) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.reentrant = reentrant
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.encoder = Encoder()
        self.head = nn.Linear(DIM, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.checkpointing:
            x = checkpoint(self.encoder, x, use_reentrant=self.reentrant)
        else:
            x = self.encoder(x)
        return self.head(x.mean(dim=1))


def build_model(checkpointing: bool = True, reentrant: bool = False) -> nn.Module:
    return Retriever(checkpointing, reentrant)


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, VOCAB, (batch_size, LENGTH), device=device)
    tokens[:, -2:] = 0  # padded to a common length
    return tokens, torch.randint(0, 4, (batch_size,), device=device)
