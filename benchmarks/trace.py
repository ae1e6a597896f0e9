"""Trace mode and diagnosis costs on torchvision resnet18 (batch 8, 64x64, CPU).

    .venv/bin/python benchmarks/trace.py

- trace: a full training step with ``trace_step`` (every module's forward and backward event)
  against a plain step, interleaved in shuffled rounds in one process; target <= 1.5x.
- diagnosis: the time ``locate_first_nonfinite`` takes to re-run a failing step (a NaN
  planted in layer3's weights) with its instruments; target < 3 s.

Writes ``benchmarks/results/trace-<device>.json``.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gradscope.core.origin import locate_first_nonfinite  # noqa: E402
from gradscope.core.trace import trace_step  # noqa: E402

ROUNDS, STEPS = 7, 4


def main() -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torchvision.models.resnet18().to(device).train()
    x = torch.randn(8, 3, 64, 64, device=device)
    y = torch.randint(0, 1000, (8,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def plain() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    def traced() -> None:
        optimizer.zero_grad(set_to_none=True)
        with trace_step(model):
            nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    variants = {"plain": plain, "trace": traced}
    for run in variants.values():
        run()
    ratios = []
    for _ in range(ROUNDS):
        times: dict[str, float] = {}
        for name in random.sample(list(variants), len(variants)):
            samples = []
            for _ in range(STEPS):
                sync()
                started = time.perf_counter()
                variants[name]()
                sync()
                samples.append(time.perf_counter() - started)
            times[name] = statistics.median(samples)
        ratios.append(times["trace"] / times["plain"])
    plain_ms = times["plain"] * 1e3

    # the module's own computation overflows (a forward hook runs inside its call)
    model.layer3[0].conv2.register_forward_hook(lambda m, i, out: out * 1e39)
    started = time.perf_counter()
    origin = locate_first_nonfinite(model, lambda: nn.functional.cross_entropy(model(x), y))
    diagnosis_s = time.perf_counter() - started
    assert origin is not None and origin.module == "layer3.0.conv2", origin

    quartiles = statistics.quantiles(ratios, n=4)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "device": str(device),
        "plain_step_ms": round(plain_ms, 2),
        "trace_ratio_median": round(statistics.median(ratios), 3),
        "trace_ratio_p25_p75": [round(quartiles[0], 3), round(quartiles[2], 3)],
        "diagnosis_seconds": round(diagnosis_s, 3),
    }
    print(f"resnet18 b8 64x64 on {device}: plain step {plain_ms:.1f} ms")
    print(f"  trace mode: {result['trace_ratio_median']:.3f}x plain "
          f"(p25-p75 {quartiles[0]:.3f}-{quartiles[2]:.3f}; target <= 1.5x)")
    print(f"  diagnosis of a failing step: {diagnosis_s:.2f} s (target < 3 s)")
    out = ROOT / "benchmarks" / "results" / f"trace-{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
