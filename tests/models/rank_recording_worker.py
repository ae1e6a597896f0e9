"""A 2-process DDP loop that records with ``gradscope.watch(record=...)``: rank 1's batch
holds a NaN at step 2. Run by tests through ``torch.multiprocessing`` (gloo on CPU,
127.0.0.1); a worker past its time limit dumps its stacks and exits."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from models.distributed_workers import init, start_workers
from torch import nn

STEPS = 4
NAN_RANK, NAN_STEP = 1, 2


def record_with_nan_in_rank_1(rank: int, world: int, port: int, out: str) -> None:
    import gradscope

    init(rank, world, port)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    watch = gradscope.watch(ddp, record=Path(out) / "run.gsrec")
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(5, 4, generator=generator)
        y = torch.randn(5, 1, generator=generator)
        if rank == NAN_RANK and step == NAN_STEP:
            x[0, 0] = float("nan")

        def compute_loss(x=x, y=y):
            return nn.functional.mse_loss(ddp(x), y)

        optimizer.zero_grad()
        loss = compute_loss()
        loss.backward()
        stats = watch.collect(loss, locate=compute_loss, batch=(x, y))
        if not stats.nonfinite:
            optimizer.step()
    watch.close()
    dist.barrier()
    dist.destroy_process_group()


def record_rank_set(folder) -> None:
    """Two gloo processes record into ``folder`` (``run.rank0.gsrec``, ``run.rank1.gsrec``)."""
    start_workers(record_with_nan_in_rank_1, folder)
