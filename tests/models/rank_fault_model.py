"""A small model script for ``gradscope run --nproc 2`` tests, with a fault on one rank.

``RANK_FAULT=KIND:RANK:STEP`` (read when the script is loaded) puts it at that rank's step:
``nan`` (a NaN in that rank's batch), ``raise`` (make_batch raises), ``hang`` (the forward
sleeps far past any step time limit), ``die`` (the process kills itself, as the out-of-memory
killer would). Without it the run is healthy.
"""

import os
import signal
import time

import torch
from torch import nn

CONFIG = {"steps": 4, "batch_size": 6, "lr": 0.05}

KIND, FAULT_RANK, FAULT_STEP = (os.environ.get("RANK_FAULT") or "none:-1:-1").split(":")
_calls = {"make_batch": 0}


def _rank() -> int:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_rank() if distributed else 0


def _fault_now(step: int) -> bool:
    return _rank() == int(FAULT_RANK) and step == int(FAULT_STEP)


class Sleepy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.ReLU())
        self.head = nn.Linear(6, 3)
        self.sleep = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep:
            time.sleep(3600)
        return self.head(self.body(x))


_model: dict[str, Sleepy] = {}


def build_model() -> nn.Module:
    _model["it"] = Sleepy()
    return _model["it"]


def make_batch(batch_size: int, device: torch.device):
    step = _calls["make_batch"]
    _calls["make_batch"] += 1
    x = torch.randn(batch_size, 5, device=device)
    y = torch.randint(0, 3, (batch_size,), device=device)
    if _fault_now(step):
        if KIND == "nan":
            x[1, 2] = float("nan")
        elif KIND == "raise":
            raise ValueError(f"no data for step {step}")
        elif KIND == "hang":
            _model["it"].sleep = True
        elif KIND == "die":
            os.kill(os.getpid(), signal.SIGKILL)
    return x, y
