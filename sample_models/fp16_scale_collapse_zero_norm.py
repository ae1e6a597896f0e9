"""A loss scale that collapses: a hand-written L2 normalisation of padded, all-zero rows.

Bag-of-embeddings text classifier: each token embedding is L2-normalised by hand,
``x / torch.sqrt((x * x).sum(-1, keepdim=True))``, then averaged. Padding positions are
zeroed by a mask. The forward is finite (a zero row is kept as it is, never divided by its
zero norm), but the derivative of ``sqrt`` at 0 is infinite, so every backward pass sends
NaN through the mask into the embedding table. Under float16 autocast with a
``GradScaler`` that looks like an ordinary overflow: the scaler skips the step and halves
the scale, again and again, and the run silently stops learning. In float32 without a
scaler the same bug shows as a NaN in the first backward.

GradScope should report: every step "skipped" by the scaler, then a loss-scale collapse
when the scale halves below 1.0 (step 17 with the default seed 0 and initial scale 65536):
a real failure (exit 1 with ``--fail-on-nonfinite``), first NaN in backward, module
``pool`` (``NormalisedMeanPool``), input grad, op ``torch.sqrt`` backward at the ``sqrt``
line, with a hint about the infinite derivative of sqrt at 0. Fix: add an epsilon under
the root, ``torch.sqrt(sumsq + 1e-12)``, or use ``torch.nn.functional.normalize`` (it
clamps the norm).
"""

import torch
from torch import nn

CONFIG = {"steps": 30, "batch_size": 8, "amp": "fp16", "lr": 0.05}

VOCAB, LENGTH, DIM, CLASSES, PAD = 40, 10, 16, 3, 0


class NormalisedMeanPool(nn.Module):
    def forward(self, embedded: torch.Tensor) -> torch.Tensor:
        norm = torch.sqrt((embedded * embedded).sum(-1, keepdim=True))
        unit = torch.where(norm > 0, embedded / norm.clamp_min(1e-30), embedded)
        return unit.mean(dim=1)


class BagOfEmbeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.pool = NormalisedMeanPool()
        self.classifier = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Padding positions are zeroed by the mask, as many text models do.
        embedded = self.embedding(tokens) * (tokens != PAD).unsqueeze(-1)
        return self.classifier(self.pool(embedded))


def build_model() -> nn.Module:
    return BagOfEmbeddings()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, VOCAB, (batch_size, LENGTH), device=device)
    tokens[:, LENGTH // 2 :] = PAD  # the second half of every sequence is padding
    labels = tokens[:, 0] % CLASSES
    return tokens, labels
