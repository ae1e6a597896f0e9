"""The seed scenario: MSE loss multiplied by 5e10 makes critical_layer's gradient explode.

``SimpleModel``: ``critical_layer = nn.Linear(10, 50)``, ReLU, ``output_layer = nn.Linear(50,
1)``, batches of 5x10, MSE loss multiplied by 5e10 (the ``loss_scale`` setting). This is the
model the app opens on. The learning rate is tiny, so the weights barely move and the
gradients stay huge but finite.

GradScope should report: no NaN/Inf; ``critical_layer`` and ``output_layer`` "exploding" at
every one of the 10 steps, from step 0, their gradient norms (``critical_layer.weight``'s
included) between 1e10 and 1e12, far above the 1000 threshold.
"""

import torch
from torch import nn

CONFIG = {"steps": 10, "batch_size": 5, "loss_scale": 5e10, "lr": 1e-12}


class SimpleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.critical_layer = nn.Linear(10, 50)
        self.relu = nn.ReLU()
        self.output_layer = nn.Linear(50, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_layer(self.relu(self.critical_layer(x)))


def build_model() -> nn.Module:
    return SimpleModel()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, 10, device=device)
    y = torch.randn(batch_size, 1, device=device)
    return x, y
