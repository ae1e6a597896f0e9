"""A 2-process DDP loop that records with ``gradscope.watch(record=...)``: rank 1's batch
holds a NaN at step 2. Run by tests through ``torch.multiprocessing`` (gloo on CPU,
127.0.0.1); a worker past its time limit dumps its stacks and exits."""

from __future__ import annotations

import torch
from models.distributed_workers import ddp_nan_loop, finish, init, start_workers
from torch import nn

STEPS = 4
NAN_RANK, NAN_STEP = 1, 2


def record_with_nan_in_rank_1(rank: int, world: int, port: int, out: str) -> None:
    init(rank, world, port)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))
    loop = ddp_nan_loop(
        rank,
        model,
        out,
        steps=STEPS,
        batch=5,
        nan_rank=NAN_RANK,
        nan_steps=(NAN_STEP,),
        seed_step=10,
        nan_at=(0, 0),
    )
    for _ in loop:
        pass
    finish()


def record_rank_set(folder) -> None:
    """Two gloo processes record into ``folder`` (``run.rank0.gsrec``, ``run.rank1.gsrec``)."""
    start_workers(record_with_nan_in_rank_1, folder)
