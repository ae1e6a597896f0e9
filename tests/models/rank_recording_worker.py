"""A 2-process DDP loop that records with ``gradscope.watch(record=...)``: rank 1's batch
holds a NaN at step 2. Run by tests through ``torch.multiprocessing`` (gloo on CPU,
127.0.0.1); a worker past its time limit dumps its stacks and exits."""

from __future__ import annotations

import datetime
import faulthandler
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

WORKER_SECONDS = 90
STEPS = 4
NAN_RANK, NAN_STEP = 1, 2


def record_with_nan_in_rank_1(rank: int, world: int, port: int, out: str) -> None:
    import gradscope

    faulthandler.dump_traceback_later(WORKER_SECONDS, exit=True, file=sys.stderr)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
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
