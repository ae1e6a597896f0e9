"""A masked language model whose batch masked no token: the loss is 0/0.

A tiny BERT-style encoder computes its own loss inside ``forward`` and returns it in a
``ModelOutput``-like dict, as Hugging Face models do (``loss_fn`` only picks ``output["loss"]``).
Labels are ``-100`` (cross-entropy's ``ignore_index``) everywhere except the ~15% of tokens
that were masked. Batches are small and sentences short, so sooner or later a batch has no
masked token at all: every label is -100 and the mean cross-entropy over zero counted tokens
is 0/0 = NaN, although the logits are perfectly finite.

GradScope should report: healthy steps, then at step 6 [3–40] first **NaN** in the
**forward** pass (the loss is computed inside the model's forward, so not "outside the
model"), module ``(model root)`` (``""``), output, op ``F.cross_entropy`` at the
``F.cross_entropy(...)`` line of ``MaskedLM.forward``, and a hint that says every target is
``ignore_index`` (-100), that the mean over zero targets is 0/0, and how to skip such batches;
not "zeros under a log".
Fix: skip batches with no masked token (``if (labels != -100).any()``), or sum the loss and
divide by ``max(count, 1)``.
"""

import torch
import torch.nn.functional as F
from torch import nn

CONFIG = {"steps": 60, "batch_size": 2, "optimizer": "adam", "lr": 1e-3}

VOCAB = 50
MASK_TOKEN = 1
LENGTH = 8
MASK_PROBABILITY = 0.15


class MaskedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.lm_head = nn.Linear(32, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.lm_head(self.encoder(self.embed(input_ids)))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def build_model() -> nn.Module:
    return MaskedLM()


def make_batch(batch_size: int, device: torch.device) -> tuple[dict, torch.Tensor]:
    tokens = torch.randint(2, VOCAB, (batch_size, LENGTH), device=device)
    masked = torch.rand(batch_size, LENGTH, device=device) < MASK_PROBABILITY
    labels = tokens.masked_fill(~masked, -100)
    input_ids = tokens.masked_fill(masked, MASK_TOKEN)
    return {"input_ids": input_ids, "labels": labels}, labels


def loss_fn(output: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    return output["loss"]
