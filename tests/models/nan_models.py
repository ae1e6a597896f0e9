"""Small models that each make a NaN/Inf in a known place (used by the origin tests)."""

import torch
from torch import nn


class LogOfZero(nn.Module):
    """Custom module whose own code makes -inf and NaN in forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - x.max())


class ForwardNaN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True))
        self.bad = LogOfZero()
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bad(self.encoder(x)))


class RootMakesInf(nn.Module):
    """The top-level forward's own code makes Inf between two finite children."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        h = h / torch.zeros_like(h)
        return self.second(h)


class SqrtAtZero(nn.Module):
    """Finite forward; d sqrt(s)/ds at s = 0 is Inf in backward."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sqrt(self.scale)


class BackwardNaN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.gate = SqrtAtZero()
        self.out = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.gate(self.inp(x)))


class Shared(nn.Module):
    """One module called twice (weight sharing) with a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.tanh(self.block(x))
        h = self.block(h)
        return {"out": self.head(h), "hidden": h}
