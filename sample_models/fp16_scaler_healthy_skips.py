"""A healthy float16 mixed-precision run: the loss scaler's first steps overflow, as designed.

``torch.amp.GradScaler`` starts from a large scale and halves it each time the scaled
gradients overflow float16, skipping that step's optimizer update; once the scale fits, it
trains. This run starts at 2**24 (some recipes start higher still), so the first steps
overflow and are skipped. Nothing is wrong with this model or its data.

GradScope should report: no NaN/Inf at all (no origin, no event, exit 0 even with
``--fail-on-nonfinite``); 7 of the first 8 steps (0-4, 6 and 7 with the default seed 0)
counted as "skipped" by the loss scaler, the layers' status "skipped" on those steps only, the loss
scale falling from 16777216 to 131072, and then training. Per-layer
gradient norms are the true, unscaled ones.
"""

import torch
from torch import nn

CONFIG = {"steps": 20, "batch_size": 16, "amp": "fp16", "amp_init_scale": 2.0**24, "lr": 0.05}


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4)
    )


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, 16, device=device)
    return x, (x[:, :4] > 0).long().sum(dim=1).clamp(max=3)
