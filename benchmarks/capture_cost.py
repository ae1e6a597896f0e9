"""What the watch's per-step capture (``gradscope.core.replay``: locating a NaN/Inf without
``locate=``) adds to a training step, on the MLP and resnet18 cases of ``overhead.py``.

    .venv/bin/python benchmarks/capture_cost.py [--pairs-mlp 1500] [--pairs-resnet18 40]
        [--device cpu|cuda]

Two figures, both robust to a busy shared machine:

- the whole step (forward, backward, ``watch.collect(loss)``, optimizer) of the same watch with
  and without the capture, interleaved step by step in a random order: the ratio of
  their 10th-percentile step times and the median of the per-pair ratios;
- the capture's own time, measured inside it (what it does before and after the model's
  call, in the model's call slot, and at the end of the step) with ``time.perf_counter``,
  against the plain step's 10th percentile: what the capture itself costs, free of the
  step-to-step noise that hides 1%. (The one Python frame around the model's call and
  what ``retain_grad`` costs in the backward are outside it: the whole-step figures hold
  them.)

Results go to ``benchmarks/results/capture-<device>.json``. On CUDA each step ends with a
``torch.cuda.synchronize()`` (the step's time is the device's), and the capture's own time
is its host time, which is all it takes: it launches no kernel.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import capture_pairs, cases

import gradscope


class _Timed:
    """Accumulates the time spent in the wrapped bound methods of one StepReplay."""

    def __init__(self, replay, names: tuple[str, ...]) -> None:
        self.seconds = 0.0
        for name in names:
            original = getattr(replay, name)
            setattr(replay, name, self._wrap(original))

    def _wrap(self, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


def measure(name: str, pairs: int, seed: int = 0, device: str = "cpu") -> dict:
    device = torch.device(device)
    cuda = device.type == "cuda"
    case = next(c for c in cases(device) if c.name == name)
    torch.manual_seed(0)
    model, x, y, loss_fn = case.build(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    watch = gradscope.watch(model)
    capture = watch.replay
    # The capture looks its methods up at call time: time them from here on. In the model's
    # call slot (the common mode) the call's end is _take and, while the first forwards
    # are learned or a generator is kept, its start _before_forward and its end _finish;
    # by module hooks the forward hook is _after_forward, which calls one of those.
    assert capture.mode == "call", capture.mode
    timer = _Timed(capture, ("_before_forward", "_take", "_finish", "step_collected"))
    capture.detach()
    capture.attach()

    inside: list[float] = []  # the capture's own time in each step that has it

    def step(variant: str) -> float:
        with_capture = variant == "gradscope"
        if with_capture:
            capture.attach()
        else:
            capture.detach()
        if cuda:
            torch.cuda.synchronize()
        before = timer.seconds
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        watch.collect(loss)
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        took = time.perf_counter() - start
        if with_capture:
            inside.append(timer.seconds - before)
        return took

    for _ in range(3):  # warm up
        step("gradscope")
        step("gradscope_no_capture")
    inside.clear()
    load_before = os.getloadavg()[0]
    measured = capture_pairs(
        step, random.Random(seed), budget_s=math.inf, min_pairs=pairs, max_pairs=pairs
    )
    with_times = [with_capture for with_capture, _ in measured]
    without_times = [without for _, without in measured]
    ratios = [with_capture / without for with_capture, without in measured]
    watch.close()
    p10_without = _quantile(without_times, 0.1)
    return {
        "description": case.description,
        "pairs": pairs,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "p10_step_ms_without_capture": round(p10_without * 1e3, 3),
        "p10_step_ms_with_capture": round(_quantile(with_times, 0.1) * 1e3, 3),
        "ratio_p10_steps": round(_quantile(with_times, 0.1) / p10_without, 4),
        "ratio_median_of_pairs": round(statistics.median(ratios), 4),
        "capture_ms_median": round(statistics.median(inside) * 1e3, 4),
        "capture_share_of_p10_step": round(statistics.median(inside) / p10_without, 5),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs-mlp", type=int, default=1500)
    parser.add_argument("--pairs-resnet18", type=int, default=40)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", default=None, help="default: results/capture-<device>.json")
    args = parser.parse_args(argv)
    if args.out is None:
        device_type = torch.device(args.device).type
        args.out = str(Path(__file__).parent / "results" / f"capture-{device_type}.json")
    torch.set_num_threads(os.cpu_count() or 1)
    results = {
        "mlp": measure("mlp", args.pairs_mlp, device=args.device),
        "resnet18": measure("resnet18", args.pairs_resnet18, device=args.device),
    }
    for name, res in results.items():
        print(
            f"{name:<9} p10 step {res['p10_step_ms_without_capture']:.2f} ms -> "
            f"{res['p10_step_ms_with_capture']:.2f} ms ({res['ratio_p10_steps']:.4f}x; "
            f"median of pairs {res['ratio_median_of_pairs']:.4f}x); capture itself "
            f"{res['capture_ms_median']:.4f} ms a step = "
            f"{100 * res['capture_share_of_p10_step']:.2f}% of the step; load "
            f"{res['load_average_1min']}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
