"""A custom ``torch.autograd.Function`` whose hand-written backward divides by zero.

A contrastive projector L2-normalises its embeddings with a hand-written
``L2Normalize`` Function (written to save memory: it keeps only the output for backward). Its
forward guards the division with an epsilon; its backward, written separately, forgot it and
divides by the norm. An empty document (its bag-of-words features are all zero) projects to
the zero vector: a finite forward and an infinite backward (x/0), NaN further down. What a
Function's backward makes lands on the gradient of the op that used its output, so it is easy
to blame the wrong line.

GradScope should report: step 0, finite loss, first **Inf** in the **backward** pass, module
``projector`` (the module that applied the Function), input grad, op
``L2Normalize backward (L2NormalizeBackward)``, at the ``L2Normalize.apply(...)`` line (not the
``head`` that consumed its output), and a hint to check the Function's backward formula.
Fix: divide by ``norm.clamp_min(eps)`` in ``backward`` too (or use
``torch.nn.functional.normalize``).
"""

import torch
from torch import nn

CONFIG = {"steps": 5, "batch_size": 8, "optimizer": "sgd", "lr": 1e-2}


class L2Normalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        norm = x.norm(dim=-1, keepdim=True)
        y = x / norm.clamp_min(1e-8)
        ctx.save_for_backward(y, norm)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        y, norm = ctx.saved_tensors
        return (grad - y * (grad * y).sum(dim=-1, keepdim=True)) / norm


class Projector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(12, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return L2Normalize.apply(self.lin(x))


class ContrastiveNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.projector = Projector()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.projector(x))


def build_model() -> nn.Module:
    return ContrastiveNet()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(batch_size, 12, device=device).round()  # bag-of-words presence
    x[0] = 0.0  # an empty document
    return x, torch.randint(0, 3, (batch_size,), device=device)
