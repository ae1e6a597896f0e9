"""Recording cost and recording load time, at 500 watched layers.

    .venv/bin/python benchmarks/recording.py            # 100,000-step load test
    .venv/bin/python benchmarks/recording.py --steps 20000

Measures, on this machine's CPU:

1. ``append``: the training thread's cost of recording one step of 500 layers
   (``RecordingWriter.append``: a bounded-queue put), median and 99th percentile;
2. ``writer``: the background writer thread's CPU time per step (packing float32 BLOBs,
   onset events, batched SQLite commits), measured with ``time.thread_time``;
3. ``sustained``: wall time per step of appending a long run as fast as possible and
   flushing it (the writer keeping up, nothing dropped);
4. ``collect``: a real 500-layer model, ``GradientWatch.collect`` with ``record=`` against
   ``GradientWatch.collect``, alternating step by step; the median of the paired
   differences is what recording adds to a step, writer thread included (it competes for
   the GIL and the CPU);
5. ``load``: a recording of 500 layers x ``--steps`` steps: opening it, a decimated load
   (``load(max_rows=5000)``, what the app needs for a first view), one layer's statistic at
   full resolution (``read_statistic``), a zoomed-in window of 2,000 steps of every layer
   (``read_window``), following new steps (``read_new_steps``) and a full load of every
   value.

Results are printed and written to ``benchmarks/results/recording-cpu.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gradscope.core.module_tree import build_module_tree  # noqa: E402
from gradscope.core.recording import (  # noqa: E402
    RecordingReader,
    RecordingWriter,
)
from gradscope.core.watch import GradientWatch  # noqa: E402

LAYERS = 500


def deep_model(layers: int = LAYERS, width: int = 16) -> nn.Module:
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def sample_stats(model: nn.Module) -> tuple[GradientWatch, list]:
    """A few real StepStats of the 500-layer model."""
    watch = GradientWatch(model)
    x = torch.randn(4, 16)
    samples = []
    for _ in range(8):
        model.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        samples.append(watch.collect(loss))
    return watch, samples


def measure_append(watch: GradientWatch, samples: list, steps: int, folder: Path) -> dict:
    writer = RecordingWriter(
        folder / "append.gsrec",
        build_module_tree(watch.model),
        {"bench": True},
        max_pending=steps + 1,
    )
    prepared = [dataclasses.replace(samples[i % len(samples)], step=i) for i in range(steps)]
    times = []
    started = time.perf_counter()
    for stats in prepared:
        t0 = time.perf_counter()
        writer.append(stats, watch.layers)
        times.append(time.perf_counter() - t0)
    writer.close()
    wall = time.perf_counter() - started
    assert writer.dropped == 0
    times.sort()
    return {
        "steps": steps,
        "append_median_us": 1e6 * statistics.median(times),
        "append_p99_us": 1e6 * times[int(0.99 * len(times))],
        "writer_cpu_per_step_us": 1e6 * writer.thread_seconds / steps,
        "sustained_wall_per_step_us": 1e6 * wall / steps,
        "file_bytes_per_step": (folder / "append.gsrec").stat().st_size / steps,
    }


def measure_collect(pairs: int, folder: Path) -> dict:
    """Plain and recording watch on the same model, alternating step by step so that
    machine drift hits both alike; the median of the paired differences is the cost."""
    torch.manual_seed(0)
    model = deep_model()
    x = torch.randn(4, 16)
    plain = GradientWatch(model)
    recording = GradientWatch(model, record=folder / "collect.gsrec")
    times: dict[str, list[float]] = {"plain": [], "recording": []}
    for pair in range(pairs + 5):
        order = (("plain", plain), ("recording", recording))
        for name, watch in order if pair % 2 else order[::-1]:
            model.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            t0 = time.perf_counter()
            watch.collect(loss)
            if pair >= 5:  # warm-up
                times[name].append(time.perf_counter() - t0)
    recording.close()
    differences = [r - p for r, p in zip(times["recording"], times["plain"], strict=True)]
    return {
        "pairs": pairs,
        "collect_plain_median_ms": 1e3 * statistics.median(times["plain"]),
        "collect_recording_median_ms": 1e3 * statistics.median(times["recording"]),
        "paired_difference_median_ms": 1e3 * statistics.median(differences),
        "paired_difference_quartiles_ms": [
            1e3 * q for q in statistics.quantiles(differences, n=4)[::2]
        ],
    }


def build_big(path: Path, watch: GradientWatch, samples: list, steps: int) -> float:
    warnings.simplefilter("ignore", RuntimeWarning)  # the builder outruns the writer on purpose
    started = time.perf_counter()
    writer = RecordingWriter(
        path, build_module_tree(watch.model), {"bench": True}, commit_steps=2000, max_pending=4096
    )
    for i in range(steps):
        stats = dataclasses.replace(samples[i % len(samples)], step=i)
        # Vary the values so the file is not unrealistically compressible in the page cache.
        stats.grad_norm = stats.grad_norm * (1.0 + 1e-4 * (i % 97))
        while not writer.append(stats, watch.layers):
            writer.dropped -= 1
            time.sleep(0.01)
    writer.close()
    return time.perf_counter() - started


def measure_load(path: Path, steps: int) -> dict:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    reader = RecordingReader(path)
    timings["open_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _, history = reader.load(max_rows=5000)
    timings["load_decimated_5000_s"] = time.perf_counter() - t0
    timings["decimated_rows"] = history.count

    layer = reader.layer_names[LAYERS // 2]
    t0 = time.perf_counter()
    _, values = reader.read_statistic("grad_norm", layer)
    timings["read_statistic_one_layer_all_steps_s"] = time.perf_counter() - t0
    assert len(values) == steps

    t0 = time.perf_counter()
    window = reader.read_window(steps // 2, steps // 2 + 2000)
    timings["read_window_2000_rows_s"] = time.perf_counter() - t0
    assert window.count == min(2000, steps - steps // 2)

    t0 = time.perf_counter()
    reader.read_new_steps(history)
    timings["read_new_steps_nothing_new_s"] = time.perf_counter() - t0
    reader.close()

    reader = RecordingReader(path)
    t0 = time.perf_counter()
    _, history = reader.load()
    timings["load_full_s"] = time.perf_counter() - t0
    timings["full_history_bytes"] = history.nbytes()
    assert history.count == steps
    np.testing.assert_array_equal(history.series("grad_norm", layer), values)
    reader.close()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100_000, help="steps in the load test")
    parser.add_argument("--append-steps", type=int, default=5000)
    parser.add_argument("--keep", metavar="FOLDER", help="write the recordings here")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    folder = Path(args.keep or tempfile.mkdtemp(prefix="gradscope-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.gsrec*"):
        old.unlink()

    torch.manual_seed(0)
    model = deep_model()
    watch, samples = sample_stats(model)
    results: dict = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "layers": LAYERS,
    }
    results["append"] = measure_append(watch, samples, args.append_steps, folder)
    print("append:", json.dumps(results["append"], indent=1))
    results["collect"] = measure_collect(pairs=300, folder=folder)
    print("collect:", json.dumps(results["collect"], indent=1))

    big = folder / "big.gsrec"
    results["write_big_s"] = build_big(big, watch, samples, args.steps)
    results["big_steps"] = args.steps
    results["big_file_bytes"] = big.stat().st_size
    print(
        f"wrote {args.steps:,} steps in {results['write_big_s']:.1f} s, "
        f"{big.stat().st_size / 1e6:.0f} MB"
    )
    results["load"] = measure_load(big, args.steps)
    print("load:", json.dumps(results["load"], indent=1))

    out = ROOT / "benchmarks" / "results" / "recording-cpu.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"results in {out}")
    if not args.keep:
        for old in folder.glob("*.gsrec*"):
            old.unlink()
        folder.rmdir()


if __name__ == "__main__":
    main()
