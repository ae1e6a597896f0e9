"""NaN made in the loss function: a hand-written cross-entropy, ``log(softmax(x))``.

The classifier's own code is fine. Its ``loss_fn`` computes cross-entropy as
``-(one_hot * torch.log(torch.softmax(logits, -1))).sum(-1)``. While the logits are small
this is correct, but the learning rate is high and the data easy, so the model quickly
becomes very confident: once the gap between the logits passes about 104, the softmax of the
losing classes underflows to exactly 0 in float32, ``log(0)`` is ``-inf`` and
``0 * -inf`` is NaN, so the loss is NaN. ``F.cross_entropy`` (log-softmax in one stable
operation) would have been fine.

GradScope should report: healthy steps first (finite loss, every layer "ok"), then, between
steps 5 and 20 (step 13 with the default seed 0), the first non-finite value in the loss
phase, outside the model (module None): an Inf made by op ``torch.log`` (its input's minimum
is exactly 0) at the ``torch.log`` line of ``loss_fn``, which the next line turns into a NaN
loss; every layer "nonfinite" at that step and the run halted there.
Fix: ``F.cross_entropy(logits, target)`` or ``torch.log_softmax``.
"""

import torch
from torch import nn
from torch.nn import functional as F

CONFIG = {"steps": 30, "batch_size": 32, "optimizer": "sgd", "lr": 1.0, "momentum": 0.9}

FEATURES = 20
CLASSES = 5


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU())
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def build_model() -> nn.Module:
    return Classifier()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, CLASSES, (batch_size,), device=device)
    x = torch.randn(batch_size, FEATURES, device=device)
    x[torch.arange(batch_size), labels] += 3.0  # the label is written into the input
    return x, labels


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    one_hot = F.one_hot(labels, CLASSES).float()
    probs = torch.softmax(logits, dim=-1)
    log_probs = torch.log(probs)
    return -(one_hot * log_probs).sum(dim=-1).mean()
