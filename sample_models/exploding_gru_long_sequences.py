"""Exploding recurrent network: a GRU over long sequences, trained without gradient clipping.

A GRU reads 64-step sensor sequences and regresses their running total. The gradient of its
recurrent weights is a sum over every time step, the learning rate is too high for that and
there is no gradient clipping: each update makes the weights larger, which makes the next
prediction error and the next gradient larger still. The GRU's gradient norm climbs from
below 1 to beyond 1e20 within about fifteen steps (dropping to 0 now and then, when a huge
update has saturated its gates: GradScope flags those steps "vanishing"), the head's follows,
and the prediction error grows until its square no longer fits in float32 (max 3.4e38): the
loss turns Inf.

GradScope should report: a few "ok" steps; ``encoder.rnn`` (the GRU) "exploding" from around
step 6 (between steps 3 and 15), its gradient norm growing by more than 15 orders of
magnitude; ``head`` "exploding" soon after; then, several steps later, between steps 12 and
35 (step 22 with the default seed 0), first Inf in the loss phase, outside the model, op
``F.mse_loss`` at the line of ``loss_fn`` (its input, the prediction, is around 1e19), and the
run halted there; both layers' gradients are still finite, if huge, at that step. The
"exploding" events are the early warning, well before anything is non-finite. The hint is
the one for a loss too large for its dtype. (Without this script's ``loss_fn``, GradScope's
default MSE gives the same numbers and the same origin, with no line: none of yours made it.)
Fix: gradient clipping (``clip: 1.0`` keeps this run finite) and a lower learning rate.
"""

import torch
from torch import nn
from torch.nn import functional as F

CONFIG = {"steps": 40, "batch_size": 8, "optimizer": "sgd", "lr": 0.7, "momentum": 0.9}

SEQUENCE = 64
SENSORS = 4
HIDDEN = 32


class SequenceEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(SENSORS, HIDDEN, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(x)
        return states[:, -1]


class SequenceRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = SequenceEncoder()
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def build_model() -> nn.Module:
    return SequenceRegressor()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, SEQUENCE, SENSORS, device=device)
    total = x[:, :, 0].sum(dim=1, keepdim=True) / SEQUENCE**0.5
    return x, total


def loss_fn(prediction: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(prediction, total)
