"""Backward-only NaN: the derivative of ``sqrt`` at 0, with a perfectly finite forward pass.

A siamese embedding model is trained with a contrastive loss on pairs of items. Its
hand-written ``EuclideanDistance`` computes ``((a - b) ** 2).sum(-1).sqrt()``. Some pairs
compare an item with itself (a "positive" pair made by the data pipeline without any
augmentation), so their distance is exactly 0: the forward pass, the distance and the loss
are all finite, but d sqrt(s)/ds = 1 / (2 sqrt(s)) is Inf at s = 0, and the chain rule
turns it into NaN in every encoder gradient.

GradScope should report: step 0, a finite loss, first NaN in the backward pass (the
gradient arriving at sqrt is 0 for those pairs, so sqrt's backward makes 0 / 0), module
``distance``, input grad, op ``Tensor.sqrt`` (its backward, ``SqrtBackward0``), at the
``.sqrt()`` line of ``EuclideanDistance.forward``; ``encoder.0``, ``encoder.2`` and
``projection`` "nonfinite" at step 0 and the run halted there.
Fix: ``(d2 + 1e-12).sqrt()``, or ``torch.nn.functional.pairwise_distance`` (which adds eps).
"""

import torch
from torch import nn

CONFIG = {"steps": 10, "batch_size": 8, "optimizer": "adam", "lr": 1e-3}

FEATURES = 24
EMBEDDING = 16
MARGIN = 1.0


class EuclideanDistance(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        squared = ((a - b) ** 2).sum(dim=-1)
        return squared.sqrt()


class SiameseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 32))
        self.projection = nn.Linear(32, EMBEDDING)
        self.distance = EuclideanDistance()

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(torch.relu(self.encoder(x)))

    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return self.distance(self.embed(first), self.embed(second))


def build_model() -> nn.Module:
    return SiameseNet()


def make_batch(batch_size: int, device: torch.device):
    first = torch.randn(batch_size, FEATURES, device=device)
    second = torch.randn(batch_size, FEATURES, device=device)
    same = torch.zeros(batch_size, dtype=torch.bool, device=device)
    same[::2] = True  # every other pair is a positive pair: the item with itself
    second = torch.where(same[:, None], first, second)
    return (first, second), same.float()


def loss_fn(distance: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """Contrastive loss: pull positive pairs together, push negatives beyond the margin."""
    positive = same * distance.pow(2)
    negative = (1 - same) * torch.clamp(MARGIN - distance, min=0).pow(2)
    return (positive + negative).mean()
