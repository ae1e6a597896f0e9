"""Half-precision underflow in the optimizer: pure float16 training with Adam's default eps.

A bag-of-words review classifier is converted to float16 (``model.half()``) and trained with
Adam. Adam divides each update by ``sqrt(v) + eps``; in float16, ``eps = 1e-8`` rounds to 0
(the smallest float16 number is 6e-8) and so do the squared gradients of ``v`` (around 1e-11
here). The very first update therefore divides by zero: the embedding weights that got a
gradient become Inf (``m / 0``) and rows that got none NaN (``0 / 0``). Step 0 itself is
finite; from step 1 on, everything that reads those weights is non-finite. Float32 (or
autocast, which keeps float32 master weights) would be fine.

GradScope should report: step 0 finite, all layers "ok"; the run halted at step 1, where
every layer is "nonfinite"; the origin is step 0's optimizer update, not an operation of the
forward pass (``F.embedding`` only looks up rows that are already Inf/NaN): first NaN at step
0 in the "update" phase, module ``embedding``, tensor ``weight``, op ``Adam.step``, no line of
the model's code, and a hint about Adam's eps in float16.
Fix: ``eps=1e-4`` (representable in float16), or train in float32 / with autocast.
"""

import torch
from torch import nn
from torch.nn import functional as F

CONFIG = {"steps": 10, "batch_size": 16, "optimizer": "adam", "lr": 1e-3}

VOCAB = 200
LENGTH = 16
DIM = 16


class BagOfWords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(DIM, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(tokens).mean(dim=1))


def build_model(dtype: torch.dtype = torch.float16) -> nn.Module:
    return BagOfWords().to(dtype)


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 2, (batch_size,), device=device)
    tokens = torch.randint(0, VOCAB // 2, (batch_size, LENGTH), device=device)
    tokens = tokens + labels[:, None] * (VOCAB // 2)  # positive reviews use other words
    return tokens, labels


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)
