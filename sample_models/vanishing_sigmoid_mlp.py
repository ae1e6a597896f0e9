"""Vanishing gradients: a deep, plain sigmoid MLP (no residuals, no normalisation).

Each sigmoid passes back at most a quarter of the gradient it receives and PyTorch's default
Linear init shrinks it further, so the gradient reaching the first layers is many orders of
magnitude smaller than the gradient of the head. The loss barely moves.

GradScope should report: no NaN/Inf; from step 0 on, the first hidden layers ``hidden.0`` to
``hidden.5`` "vanishing" (gradient norm below the default 1e-7 threshold), their gradient
norms falling layer by layer from ``head`` down to ``hidden.0``, 1e8 or more times below
``head``'s; ``head`` and the last hidden layers "ok".
"""

import torch
from torch import nn

CONFIG = {"steps": 10, "batch_size": 16, "optimizer": "sgd", "lr": 0.01}

DEPTH = 12
WIDTH = 32


class DeepSigmoidMLP(nn.Module):
    def __init__(self, depth: int = DEPTH, width: int = WIDTH) -> None:
        super().__init__()
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = torch.sigmoid(layer(x))
        return self.head(x)


def build_model() -> nn.Module:
    return DeepSigmoidMLP()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, WIDTH, device=device)
    y = x[:, :1].sign()
    return x, y
