"""Models written without GradScope in mind: nested containers, attention with a padding
mask, a module called twice, in-place ops and dict outputs."""

import torch
from torch import nn


class Scaler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.gain
        y.div_(self.gain - 1.0)  # in-place division by zero: 1 - 1
        return y


class DeepNest(nn.Module):
    """Three levels of containers; the fault sits at the bottom."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            [nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True)) for _ in range(2)]
            + [nn.Sequential(nn.Sequential(nn.Linear(8, 8), Scaler()), nn.ReLU())]
        )
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        for stage in self.stages:
            x = stage(x)
        return {"logits": self.head(x), "features": x}


class PaddedAttention(nn.Module):
    """A sequence whose every key is padding: the softmax of an all -inf row is NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h, _ = self.attn(h, h, h, key_padding_mask=padding)
        return self.out(h).mean(dim=1)


class TiedTwice(nn.Module):
    """One block called twice; the second call overflows float16."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(x)
        h = torch.exp(h.half() * 40).float()
        return self.head(self.block(h))
