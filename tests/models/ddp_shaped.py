"""A DistributedDataParallel training script for torchrun (gloo, CPU), with no GradScope in
it. Rank 1's batch holds a NaN at ``--nan-step`` (default: never)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--nan-step", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(100 + rank)
for step in range(args.steps):
    x = torch.randn(8, 6, generator=generator)
    y = torch.randint(0, 2, (8,), generator=generator)
    if rank == 1 and step == args.nan_step:
        x[5, 2] = float("nan")
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
print(f"rank {rank} done in {os.path.basename(__file__)}")
