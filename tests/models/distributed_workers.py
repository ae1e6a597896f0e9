"""Worker processes for the 2-process torch.distributed tests (gloo on CPU, 127.0.0.1).

Each worker dumps every thread's stack and exits if it runs past its time limit, so a hang
fails the test with stacks instead of stalling the suite.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

WORKER_SECONDS = 90


def init(rank: int, world: int, port: int) -> None:
    faulthandler.dump_traceback_later(WORKER_SECONDS, exit=True, file=sys.stderr)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )


def ddp_nan_in_one_rank(rank: int, world: int, port: int, out: str) -> None:
    """DDP with BatchNorm; rank 0's batch holds a NaN at steps 0 and 3. Every rank collects
    with locate= and records; the loop skips the optimizer on non-finite steps."""
    import gradscope

    init(rank, world, port)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    watch = gradscope.watch(ddp, record=Path(out) / "run.gsrec")
    facts = {"layers": [layer.name for layer in watch.layers], "steps": []}
    for step in range(6):
        generator = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 6, generator=generator)
        y = torch.randn(8, 1, generator=generator)
        if rank == 0 and step in (0, 3):
            x[2, 1] = float("nan")

        def compute_loss(x=x, y=y):
            return nn.functional.mse_loss(ddp(x), y)

        optimizer.zero_grad()
        loss = compute_loss()
        loss.backward()
        stats = watch.collect(loss, locate=compute_loss, batch=(x, y))
        if not stats.nonfinite:
            optimizer.step()
        origin = stats.origin
        facts["steps"].append(
            {
                "step": stats.step,
                "nonfinite": stats.nonfinite,
                "origin": None if origin is None else origin.to_dict(),
            }
        )
    watch.close()
    facts["path"] = str(watch.path)
    Path(out, f"facts{rank}.json").write_text(json.dumps(facts, default=str))
    dist.barrier()
    dist.destroy_process_group()
