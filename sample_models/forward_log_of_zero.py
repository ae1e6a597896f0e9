"""Forward Inf from a custom module's own code: ``torch.log`` of an exact zero.

A small keyword-spotting model turns audio frames into log filterbank energies in a
hand-written ``SpectralFrontend``. The batches are zero-padded to a common length, so the
padded frames are pure silence: their filterbank energy is exactly 0 and ``torch.log(0)``
is ``-inf`` (there is no epsilon inside the log). The Inf flows through the classifier and
the loss is NaN at the very first step.

GradScope should report: step 0, first INF in the forward pass, module ``frontend`` (the
custom module, not its built-in ``frontend.filterbank`` Linear, whose output is finite
zeros), output, op ``torch.log`` at the ``torch.log`` line of ``SpectralFrontend.forward``;
every layer "nonfinite" at step 0 and the run halted there.
Fix: ``torch.log(energy + 1e-6)`` (or ``torch.log(energy.clamp_min(1e-6))``).
"""

import torch
from torch import nn

CONFIG = {"steps": 10, "batch_size": 8, "optimizer": "adam", "lr": 1e-3}

FRAME = 64
FRAMES = 20
MELS = 16
KEYWORDS = 4


class SpectralFrontend(nn.Module):
    """Power spectrum -> mel-like filterbank -> log energies."""

    def __init__(self) -> None:
        super().__init__()
        self.filterbank = nn.Linear(FRAME, MELS, bias=False)
        with torch.no_grad():
            self.filterbank.weight.uniform_(0.0, 1.0)  # energies stay >= 0

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        power = frames.pow(2)
        energy = self.filterbank(power)
        return torch.log(energy)


class KeywordSpotter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frontend = SpectralFrontend()
        self.encoder = nn.Sequential(nn.Linear(MELS, 32), nn.ReLU())
        self.classifier = nn.Linear(32, KEYWORDS)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        features = self.encoder(self.frontend(frames))
        return self.classifier(features.mean(dim=1))


def build_model() -> nn.Module:
    return KeywordSpotter()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    frames = torch.randn(batch_size, FRAMES, FRAME, device=device)
    lengths = torch.randint(FRAMES // 2, FRAMES + 1, (batch_size,), device=device)
    lengths[0] = FRAMES // 2  # at least one clip is padded
    padding = torch.arange(FRAMES, device=device)[None, :] >= lengths[:, None]
    frames = frames.masked_fill(padding[:, :, None], 0.0)
    labels = torch.randint(0, KEYWORDS, (batch_size,), device=device)
    return frames, labels
