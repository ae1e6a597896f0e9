"""A healthy model: a small CNN with batch normalisation, trained with Adam at lr 1e-2.

Nothing is wrong here; it is the reference for what a good run looks like. The task (is the
bright blob in the left or the right half of a 16x16 image?) is easy and the loss falls
steadily.

GradScope should report: no NaN/Inf, no "exploding" and no "vanishing" layer at any step:
every layer "ok" from the first step to the last, gradient norms between about 1e-3 and 10,
and the loss falling.
"""

from collections import OrderedDict

import torch
from torch import nn

CONFIG = {"steps": 20, "batch_size": 16, "optimizer": "adam", "lr": 1e-2}

SIZE = 16


class BlobClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(1, 8, 3, padding=1),
                bn1=nn.BatchNorm2d(8),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(8, 16, 3, padding=1),
                bn2=nn.BatchNorm2d(16),
                relu2=nn.ReLU(),
                pool2=nn.AdaptiveAvgPool2d((1, 2)),  # keeps left and right apart
            )
        )
        self.classifier = nn.Linear(32, 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).flatten(1))


def build_model() -> nn.Module:
    return BlobClassifier()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 2, (batch_size,), device=device)
    images = 0.1 * torch.randn(batch_size, 1, SIZE, SIZE, device=device)
    rows = torch.randint(2, SIZE - 2, (batch_size,), device=device)
    cols = torch.randint(2, SIZE // 2 - 2, (batch_size,), device=device) + labels * (SIZE // 2)
    for i in range(batch_size):
        r, c = int(rows[i]), int(cols[i])
        images[i, 0, r - 2 : r + 2, c - 2 : c + 2] += 1.0
    return images, labels
