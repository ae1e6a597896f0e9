"""Watch overhead: a full training step (forward, backward, optimizer) in five variants.

    .venv/bin/python benchmarks/overhead.py

Variants, all on the same model and batch, interleaved in shuffled rounds within this one
process so that machine drift (thermal, other load) hits them alike:

- ``plain``: no instrumentation;
- ``gradscope``: ``gradscope.watch(model)`` (every parameterised layer, default statistics:
  gradient norms every step, max |g| and weight norms every 10th) and ``watch.collect(loss)``
  after each backward;
- ``gradscope_no_capture``: the same watch without its per-step capture for locating a
  NaN/Inf without ``locate=`` (``gradscope.core.replay``: the root's inputs by reference,
  the random states, the buffers forward writes, the gradient at the model's output); the
  capture is on in ``gradscope`` only (it is detached for every other variant);
- ``gradscope_detail1``: the same with ``detail_every=1`` (every statistic every step);
- ``early_warnings``: ``gradscope_no_capture`` with ``early_warnings=True`` (issue #37: the
  forward statistics, each watched layer's output max |x| and the head's log-partition, on
  the default schedule: every step of the first 100, then every 10th; the detectors on the
  host every step). Its cost is judged against ``gradscope_no_capture`` on the due and the
  other steps apart, and amortised over the schedule past its dense start (one due step in
  10: what a long run pays; the dense start pays the due steps' ratio);
- ``seed_hook``: the seed's approach, a ``Tensor.register_hook`` on every parameter calling
  ``torch.isnan(grad).any()``, ``torch.isinf(grad).any()`` and ``grad.norm().item()``;
- ``detect_anomaly``: forward and backward under ``torch.autograd.detect_anomaly()``;
- ``reads_only``: not a tool but a yardstick: the tensor reads the required statistics
  need, by plain torch calls and with no GradScope code: one ``torch._foreach_norm`` over
  every gradient and weight (L2 and weight norms), one ``aminmax`` per gradient (max |g|),
  one ``torch.stack`` and one host transfer. Its distance to ``plain`` is what reading every
  gradient twice and every weight once costs on this machine; GradScope's distance to it is
  its own bookkeeping, less what its device-specific choices save (on a CPU, the fused
  ord-inf norm for small tensors' max |g| instead of one ``aminmax`` each).
- ``norms_only``: the yardstick of the default watch's plain steps: one ``_foreach_norm``
  over every gradient, the loss, one ``torch.stack`` and one host transfer, by plain torch
  calls. Its distance to ``plain`` is what reading every gradient once costs.

Each round runs a block of steps of every variant, the variants interleaved step by step in
a fresh random order for each step (a shared 2-core machine's speed drifts by 20% within
seconds: interleaving makes the drift hit every variant alike); the block's median step time
divided by plain's in the same round is that round's ratio. The table shows the median of
those ratios over the rounds and their spread (25th-75th percentile, and min-max in the
JSON), and, as a figure that other load on a shared machine disturbs least, the ratio of the
variants' 10th-percentile step times. Each model has a time budget (the run stops adding
rounds when it is spent, after at least 3), so the whole run takes under 5 minutes even on a
busy 2-core machine; the 1-minute load average before and after each model is recorded.
Threads are pinned with ``torch.set_num_threads(os.cpu_count())``.

The capture's cost (issue #24: at most 1% of the watched step) is also measured on its own
after the rounds, by pairs of steps: one ``gradscope`` step and one ``gradscope_no_capture``
step next to each other, in a fresh random order for each pair, for ``CAPTURE_BUDGET_S``
seconds; the target is judged on the median of the pairs' ratios. A difference of some
30 µs on a 4 ms step is within the drift between two 8-step blocks, but not between two
neighbouring steps.

On CUDA (when ``torch.cuda.is_available()``) resnet50 at batch 64 is added, steps are timed
with a synchronisation at each step's end, and the watch's ``launch()`` runs under
``torch.cuda.set_sync_debug_mode("error")``, so any host synchronisation inside it raises.

Distributed cases (``fsdp2_mlp``, ``fsdp2_transformer``; run by default on the CPU, alone with
``--distributed``): the same models sharded with FSDP2 (``fully_shard`` per layer, then the
root) on 2 processes spawned here, gloo on the CPU at 127.0.0.1, one torch thread each. The
variants, in the same shuffled order on both ranks (their collectives must pair up):
``plain``; ``clip``, ``torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`` after
backward (under FSDP2 it reduces the DTensor norms with its own all-reduce); ``gradscope`` and
``gradscope_detail1`` (``watch.collect(loss)``); ``gradscope_clip``, both; ``reads_only``, a
yardstick: each local shard's sum of squares by one ``_foreach_norm``, the loss, one
``all_gather`` of that vector and one host transfer, by plain torch calls. Rank 0 times its
steps. A variant's cost is its block median minus plain's in the same round; the added calls
(``collect()``, ``clip_grad_norm_``) are also timed alone inside the same steps, after a
barrier that every variant's step has (so both ranks start them together). The target
(watch cost <= clip_grad_norm_'s, issue #14) is judged on those calls: a whole FSDP step over
gloo moves between rounds by more than either cost on a shared 2-core machine; the table says
when the whole-step difference is within that noise. Before the timed rounds the
watch's total gradient norm is checked against the total norm ``clip_grad_norm_`` returns
(exit status 1 when they differ). A rank that fails ends the case with its traceback; a rank
that hangs dumps its stacks and is ended (each rank has a deadline of its budget plus 120 s).
``--profile`` adds rank 0's cProfile of ``collect()`` and ``clip_grad_norm_``.

Results go to ``benchmarks/results/overhead-<device>.json`` and, for the distributed cases,
``benchmarks/results/overhead-fsdp2-cpu.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gradscope  # noqa: E402

# Issue #24: the per-step capture adds at most 1% to the watched step; its paired
# comparison runs for this long per case (times --scale), at least and at most so many pairs.
# Issue #37: the early warnings add at most 2% with the default schedule, nothing off it.
EARLY_WARNINGS_TARGET = 1.02
CAPTURE_TARGET = 1.01
CAPTURE_BUDGET_S = 10.0
MIN_CAPTURE_PAIRS = 30
MAX_CAPTURE_PAIRS = 3000

VARIANTS = (
    "plain",
    "gradscope",
    "gradscope_no_capture",
    "gradscope_detail1",
    "early_warnings",
    "seed_hook",
    "detect_anomaly",
    "reads_only",
    "norms_only",
)


# -- models ---------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    description: str
    build: Callable[[torch.device], tuple[nn.Module, torch.Tensor, torch.Tensor, Callable]]
    rounds: int  # at most; fewer when the time budget runs out (never under 3)
    steps: int
    target: float | None
    budget_s: float
    target_detail1: float | None = None  # the watch with detail_every=1
    momentum: float = 0.9  # the SGD optimizer's
    warmup_steps: int = 0  # plain steps before the timed rounds (a deep model's gradients vanish)


def _mlp(device: torch.device):
    width, depth, batch = 256, 20, 32
    layers: list[nn.Module] = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    model = nn.Sequential(*layers).to(device)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return model, x, y, nn.functional.cross_entropy


def _resnet(name: str, batch: int, size: int):
    def build(device: torch.device):
        import torchvision

        model = getattr(torchvision.models, name)(weights=None).to(device)
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        return model, x, y, nn.functional.cross_entropy

    return build


class _Encoder(nn.Module):
    def __init__(self, d: int = 128, heads: int = 4, layers: int = 4, classes: int = 10):
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d, heads, dim_feedforward=4 * d, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def _transformer(device: torch.device):
    batch, seq, d = 16, 64, 128
    model = _Encoder(d).to(device)
    x = torch.randn(batch, seq, d, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return model, x, y, nn.functional.cross_entropy


class _ManySmall(nn.Module):
    """1,500 x (Linear(16, 16) + LayerNorm(16)): 3,000 small parameterised layers."""

    def __init__(self, blocks: int = 1500, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width)) for _ in range(blocks)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def _many_small(device: torch.device, batch: int = 32):
    model = _ManySmall().to(device)
    x = torch.randn(batch, 16, device=device)
    y = torch.randint(0, 16, (batch,), device=device)
    return model, x, y, nn.functional.cross_entropy


def _vanishing_tanh(device: torch.device):
    """200 x (Linear(8, 8) + Tanh): per-layer norms from 1e-20 down to 1e-35 and below."""
    layers: list[nn.Module] = []
    for _ in range(200):
        layers += [nn.Linear(8, 8), nn.Tanh()]
    model = nn.Sequential(*layers).to(device)
    x = torch.randn(32, 8, device=device)
    y = torch.randn(32, 8, device=device)
    return model, x, y, nn.functional.mse_loss


def cases(device: torch.device) -> list[Case]:
    found = [
        Case("mlp", "20-layer MLP, width 256, batch 32", _mlp, 80, 8, 1.10, 40, 1.20),
        Case(
            "resnet18",
            "torchvision resnet18, batch 16, 64x64",
            _resnet("resnet18", 16, 64),
            60,
            4,
            1.03,
            100,
        ),
        Case(
            "many_layers",
            "3,000 small layers: 1,500 x (Linear(16,16) + LayerNorm(16)), batch 32",
            _many_small,
            30,
            4,
            1.15,
            100,
        ),
        Case(
            "many_layers_b8",
            "3,000 small layers at batch 8, SGD without momentum, after 20 warm-up steps "
            "(many tiny gradients)",
            lambda device: _many_small(device, batch=8),
            30,
            4,
            1.25,
            100,
            momentum=0.0,
            warmup_steps=20,
        ),
        Case(
            "vanishing",
            "200 x (Linear(8,8) + Tanh), batch 32 (vanishing gradients)",
            _vanishing_tanh,
            30,
            8,
            1.25,
            60,
        ),
        Case(
            "transformer",
            "4-layer transformer encoder, d=128, seq 64, batch 16",
            _transformer,
            60,
            4,
            1.02,
            70,
        ),
    ]
    if device.type == "cuda":
        found.append(
            Case(
                "resnet50",
                "torchvision resnet50, batch 64, 224x224",
                _resnet("resnet50", 64, 224),
                20,
                10,
                1.02,
                60,
            )
        )
    return found


# -- variants -------------------------------------------------------------------------
class SeedHook:
    """The seed's per-parameter tensor hook (three reductions and a sync per parameter)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.handles: list = []
        self.norms: dict[str, float] = {}
        self.flagged: list[str] = []

    def attach(self) -> None:
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                self.handles.append(p.register_hook(self._hook(name)))

    def _hook(self, name: str):
        def hook(grad: torch.Tensor) -> None:
            if torch.isnan(grad).any() or torch.isinf(grad).any():
                self.flagged.append(name)
            self.norms[name] = grad.norm().item()

        return hook

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _reads_only(params: list[torch.Tensor], loss: torch.Tensor) -> list[float]:
    grads = [p.grad for p in params if p.grad is not None]
    figures = list(torch._foreach_norm(grads + params, 2))
    for g in grads:
        figures += torch.aminmax(g)
    figures.append(loss.detach())
    return torch.stack(figures).tolist()


def _norms_only(params: list[torch.Tensor], loss: torch.Tensor) -> list[float]:
    grads = [p.grad for p in params if p.grad is not None]
    return torch.stack([*torch._foreach_norm(grads, 2), loss.detach()]).tolist()


def _watch_collect(watch, loss: torch.Tensor, cuda: bool):
    if not cuda:
        return watch.collect(loss)
    # Any host synchronisation inside launch() raises here.
    torch.cuda.set_sync_debug_mode("error")
    try:
        transfers = watch.launch(loss)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return watch.resolve(transfers)


def run_case(case: Case, device: torch.device, rng: random.Random, scale: float) -> dict:
    torch.manual_seed(0)
    model, x, y, loss_fn = case.build(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=case.momentum)
    for _ in range(case.warmup_steps):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
    watch = gradscope.watch(model)
    capture = watch.replay  # on for the "gradscope" variant only
    watch_detail1 = gradscope.watch(model, detail_every=1, replay=False)
    watch_early = gradscope.watch(model, early_warnings=True, replay=False)
    # Its forward hooks, armed for its due steps, must not run in the other variants' steps.
    watch_early.outputs.disarm()
    if watch_early._op_reader is not None:
        watch_early._op_reader.disarm()
    early_due: list[bool] = []  # per timed step of the variant: a forward statistic was due
    params = [p for p in model.parameters() if p.requires_grad]
    seed = SeedHook(model)
    cuda = device.type == "cuda"

    def step(variant: str) -> float:
        if variant == "gradscope":
            capture.attach()
        else:
            capture.detach()
        if variant == "early_warnings":
            watch_early._arm_outputs()  # what its last collect armed (untimed) ...
            early_due.append(watch_early.outputs.armed)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if variant == "detect_anomaly":
            with torch.autograd.detect_anomaly():
                loss = loss_fn(model(x), y)
                loss.backward()
        else:
            loss = loss_fn(model(x), y)
            loss.backward()
            if variant in ("gradscope", "gradscope_no_capture"):
                _watch_collect(watch, loss, cuda)
            elif variant == "gradscope_detail1":
                _watch_collect(watch_detail1, loss, cuda)
            elif variant == "early_warnings":
                _watch_collect(watch_early, loss, cuda)
            elif variant == "reads_only":
                _reads_only(params, loss)
            elif variant == "norms_only":
                _norms_only(params, loss)
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        took = time.perf_counter() - start
        if variant == "early_warnings":
            watch_early.outputs.disarm()  # ... and taken off again until its next step
            if watch_early._op_reader is not None:  # its op reader too (a model pre-hook)
                watch_early._op_reader.disarm()
        return took

    max_rounds = max(3, round(case.rounds * scale))
    budget = case.budget_s * scale
    steps = case.steps
    load_before = os.getloadavg()[0]
    for variant in VARIANTS:  # warm up allocators, autograd caches, lazy imports
        _block(variant, step, seed, 2)
    early_due.clear()  # from here on, one per timed step (every["early_warnings"])
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    every: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
    capture_ratios: list[float] = []  # the watch with its capture over the one without
    started = time.perf_counter()
    rounds = 0
    while rounds < max_rounds and (rounds < 3 or time.perf_counter() - started < budget):
        measured = _round(step, seed, steps, rng)
        block = {}
        for variant in VARIANTS:
            every[variant] += measured[variant]
            block[variant] = statistics.median(measured[variant])
            times[variant].append(block[variant])
        for variant in VARIANTS:
            ratios[variant].append(block[variant] / block["plain"])
        capture_ratios.append(block["gradscope"] / block["gradscope_no_capture"])
        rounds += 1
    elapsed = time.perf_counter() - started
    pairs = capture_pairs(step, rng, budget_s=CAPTURE_BUDGET_S * scale)
    pair_ratios = [with_capture / without for with_capture, without in pairs]
    watch.close()
    watch_detail1.close()
    watch_early.close()

    result = {
        "description": case.description,
        "parameters": sum(p.numel() for p in model.parameters()),
        "watched_layers": len(watch.layers),
        "watched_tensors": len(watch.param_names),
        "rounds": rounds,
        "steps_per_block": steps,
        "seconds": round(elapsed, 1),
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "target_gradscope": case.target,
        "target_gradscope_detail1": case.target_detail1,
        # issue #24's target: the per-step capture adds at most 1% to the watched step
        "capture_ratio_median": round(statistics.median(capture_ratios), 4),
        "capture_ratio_p25": round(_quantile(sorted(capture_ratios), 0.25), 4),
        "capture_ratio_p75": round(_quantile(sorted(capture_ratios), 0.75), 4),
        # The same comparison over every step of the run at once (the variants interleave
        # step by step, so drift hits both alike): the median of some 500 steps each moves
        # less than a median of 8-step ratios, and the 10th percentiles least of all.
        "capture_ratio_pooled": round(
            statistics.median(every["gradscope"])
            / statistics.median(every["gradscope_no_capture"]),
            4,
        ),
        "capture_ratio_p10": round(
            _quantile(sorted(every["gradscope"]), 0.1)
            / _quantile(sorted(every["gradscope_no_capture"]), 0.1),
            4,
        ),
        # ... and as its own paired comparison, on which the target is judged (see
        # capture_pairs): the median of the pairs' ratios and of their differences.
        "capture_pairs": len(pairs),
        "capture_paired_ratio": round(statistics.median(pair_ratios), 4),
        "capture_paired_us": round(statistics.median(a - b for a, b in pairs) * 1e6, 1),
        "meets_capture_target": bool(statistics.median(pair_ratios) <= CAPTURE_TARGET),
        "early_warnings": early_warnings_cost(
            every["early_warnings"], early_due, every["gradscope_no_capture"]
        ),
        "variants": {},
    }
    plain_p10 = _quantile(sorted(every["plain"]), 0.1)
    for variant in VARIANTS:
        r = sorted(ratios[variant])
        p10 = _quantile(sorted(every[variant]), 0.1)
        result["variants"][variant] = {
            "median_step_ms": round(statistics.median(times[variant]) * 1e3, 3),
            "p10_step_ms": round(p10 * 1e3, 3),
            # Other load only ever slows a step down: the fastest steps' ratio is the
            # figure least disturbed by a busy machine.
            "ratio_p10_steps": round(p10 / plain_p10, 4),
            "ratio_median": round(statistics.median(r), 4),
            "ratio_p25": round(_quantile(r, 0.25), 4),
            "ratio_p75": round(_quantile(r, 0.75), 4),
            "ratio_min": round(r[0], 4),
            "ratio_max": round(r[-1], 4),
        }
    for key, figure in (("meets_target", "ratio_median"), ("meets_target_p10", "ratio_p10_steps")):
        g = result["variants"]["gradscope"][figure]
        result[key] = bool(
            (case.target is None or g <= case.target)
            and g < result["variants"]["seed_hook"][figure]
        )
        if case.target_detail1 is not None:
            g = result["variants"]["gradscope_detail1"][figure]
            result[key + "_detail1"] = bool(g <= case.target_detail1)
    return result


DETAIL_EVERY = 10  # the watch's default, the early warnings' schedule after its dense start


def early_warnings_cost(
    times: list[float], due: list[bool], baseline: list[float]
) -> dict[str, float | int | bool]:
    """Issue #37's figures: the ``early_warnings`` variant's steps against the same watch
    without them (``baseline``: ``gradscope_no_capture``'s steps of the same rounds), on the
    steps a forward statistic was due and on the others apart (medians), and amortised over
    the schedule: the due steps' share times their ratio plus the others'. Medians per kind
    of step, since a mean over a shared machine's steps moves with its stalls."""
    base = statistics.median(baseline)
    due_times = [t for t, d in zip(times, due, strict=True) if d]
    other_times = [t for t, d in zip(times, due, strict=True) if not d]
    due_ratio = statistics.median(due_times) / base if due_times else float("nan")
    other_ratio = statistics.median(other_times) / base if other_times else float("nan")
    # The schedule (gradscope.core.warnings.schedule) measures every step of the first
    # DENSE_STEPS, then one in detail_every: a long run pays the latter share. This run's own
    # share is mostly the dense start's, so the amortised figure takes the schedule's; with
    # no other step timed (a run within the dense start) the other steps count as the
    # baseline's, which is what they run (the detectors' host time aside).
    share = 1 / DETAIL_EVERY
    other = other_ratio if other_times else 1.0
    amortised = share * due_ratio + (1 - share) * other if due_times else other_ratio
    return {
        "due_steps": len(due_times),
        "other_steps": len(other_times),
        "due_ratio": round(due_ratio, 4),
        "other_ratio": round(other_ratio, 4),
        "dense_start_ratio": round(due_ratio, 4),  # every step of the first DENSE_STEPS
        "amortised_ratio": round(amortised, 4),
        "mean_ratio": round(statistics.fmean(times) / statistics.fmean(baseline), 4),
        "target": EARLY_WARNINGS_TARGET,
        "meets_target": bool(amortised <= EARLY_WARNINGS_TARGET),
    }


def capture_pairs(
    step: Callable[[str], float],
    rng: random.Random,
    *,
    budget_s: float,
    min_pairs: int = MIN_CAPTURE_PAIRS,
    max_pairs: int = MAX_CAPTURE_PAIRS,
) -> list[tuple[float, float]]:
    """Issue #24's target, the capture's cost, is some 30 µs on a 4 ms step: within the
    drift of a shared machine between two 8-step blocks. Pairs of steps measure it best: one
    step with the capture and one without, next to each other in a fresh random order for
    each pair, until ``budget_s`` is spent (at least ``min_pairs``, at most ``max_pairs``).
    Each pair's (step time with the capture, without); ``step`` takes ``"gradscope"`` or
    ``"gradscope_no_capture"`` (also used by ``capture_cost.py``)."""
    pairs: list[tuple[float, float]] = []
    started = time.perf_counter()
    while len(pairs) < max_pairs and (
        len(pairs) < min_pairs or time.perf_counter() - started < budget_s
    ):
        order = ["gradscope", "gradscope_no_capture"]
        rng.shuffle(order)
        took = {variant: step(variant) for variant in order}
        pairs.append((took["gradscope"], took["gradscope_no_capture"]))
    return pairs


def _block(variant: str, step: Callable[[str], float], seed: SeedHook, steps: int) -> list:
    if variant == "seed_hook":
        seed.attach()
    try:
        gc.collect()
        step(variant)  # untimed: the first step after switching variant
        return [step(variant) for _ in range(steps)]
    finally:
        if variant == "seed_hook":
            seed.detach()


def _round(
    step: Callable[[str], float], seed: SeedHook, steps: int, rng: random.Random
) -> dict[str, list[float]]:
    """One round: ``steps`` step times of each variant, the variants interleaved step by
    step in a fresh random order each time, so that the machine's drift (a shared 2-core
    machine's speed moves by 20% within seconds) hits them alike."""
    gc.collect()
    measured: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for _ in range(steps):
        order = list(VARIANTS)
        rng.shuffle(order)
        for variant in order:
            if variant == "seed_hook":
                seed.attach()
            try:
                measured[variant].append(step(variant))
            finally:
                if variant == "seed_hook":
                    seed.detach()
    return measured


def _quantile(ordered: list[float], q: float) -> float:
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# -- distributed: FSDP2 on 2 gloo processes ---------------------------------------------
DIST_VARIANTS = (
    "plain",
    "clip",
    "gradscope",
    "gradscope_detail1",
    "gradscope_clip",
    "reads_only",
)
DIST_WORLD = 2
DIST_JOIN_MARGIN_S = 120.0  # on top of a case's budget: start-up, warm-up, the last round
SANITY_RELATIVE = 1e-5  # the watch's total grad norm against clip_grad_norm_'s
PROFILE_CALLS, PROFILE_LINES = 20, 15  # --profile: calls profiled, functions shown


@dataclass
class DistributedCase:
    name: str
    description: str
    build: Callable[[torch.device], tuple[nn.Module, torch.Tensor, torch.Tensor, Callable]]
    units: Callable[[nn.Module], list[nn.Module]]  # sharded one by one, then the root
    rounds: int  # at most; fewer when the time budget runs out (never under min_rounds)
    steps: int
    budget_s: float
    min_rounds: int = 3


def _mlp_units(model: nn.Module) -> list[nn.Module]:
    return [m for m in model if next(m.parameters(), None) is not None]


def _encoder_units(model: nn.Module) -> list[nn.Module]:
    return [*model.encoder.layers, model.head]


def distributed_cases() -> list[DistributedCase]:
    return [
        DistributedCase(
            "fsdp2_mlp",
            "20-layer MLP, width 256, batch 32 per rank; fully_shard per Linear and the root",
            _mlp,
            _mlp_units,
            60,
            6,
            40,
        ),
        DistributedCase(
            "fsdp2_transformer",
            "4-layer transformer encoder, d=128, seq 64, batch 16 per rank; fully_shard per "
            "encoder layer, the head and the root",
            _transformer,
            _encoder_units,
            40,
            3,
            50,
        ),
    ]


def _fsdp_worker(
    rank: int,
    world: int,
    port: int,
    case: DistributedCase,
    scale: float,
    out: str,
    seconds: float,
    profile: bool = False,
) -> None:
    """One rank of a distributed case: every rank runs the same variants in the same order
    (their collectives must pair up); rank 0 times its steps and writes the result."""
    import datetime
    import faulthandler

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from gradscope.core.distributed.worker import leave

    # A hang ends this process with every thread's stack on stderr, never a stalled run.
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    threads = max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", message=".*[Aa]nomaly [Dd]etection.*")
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    device = torch.device("cpu")
    torch.manual_seed(0)  # the same weights on every rank
    model, x, y, loss_fn = case.build(device)
    torch.manual_seed(1000 + rank)  # each rank its own batch
    _, x, y, _ = case.build(device)
    for unit in case.units(model):
        fully_shard(unit)
    fully_shard(model)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    watch = gradscope.watch(model)
    watch_detail1 = gradscope.watch(model, detail_every=1)
    params = [p for p in model.parameters() if p.requires_grad]

    def clip() -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, 1.0)

    # all_gather_into_tensor is deprecated (a FutureWarning) from torch 2.14 on.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def reads_only(loss: torch.Tensor) -> list[float]:
        # A yardstick, not a tool: what the default watch's figures need on a sharded
        # model, by plain torch calls: each local shard's sum of squares (one fused call)
        # and the loss, one all_gather of that vector, one host transfer.
        shards = [p.grad.to_local() for p in params if p.grad is not None]
        mine = torch.stack([*torch._foreach_norm(shards, 2), loss.detach()]).double()
        mine[:-1] = mine[:-1].square()
        gathered = torch.empty(world * mine.numel(), dtype=mine.dtype)
        gather(gathered, mine)
        return gathered.view(world, -1).sum(dim=0).tolist()

    calls: list[float] = []  # the time of the added calls alone, per step

    def step(variant: str) -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        # Every variant (plain too) meets the other rank here, so the calls timed next start
        # together and their times hold no wait for a rank still in its backward.
        dist.barrier()
        called = time.perf_counter()
        if variant in ("gradscope", "gradscope_clip"):
            watch.collect(loss)
        elif variant == "gradscope_detail1":
            watch_detail1.collect(loss)
        elif variant == "reads_only":
            reads_only(loss)
        if variant in ("clip", "gradscope_clip"):
            clip()
        done = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        calls.append(done - called)
        return end - start

    # Sanity, untimed: the watch's total gradient norm is clip_grad_norm_'s (both before
    # clipping), so the figures compared below are right, not only fast.
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    checks = {}
    for label, w in (("gradscope", watch), ("gradscope_detail1", watch_detail1)):
        checks[label] = w.collect(loss).total_grad_norm
    total = clip()
    total = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
    optimizer.zero_grad(set_to_none=True)
    sanity = {
        "clip_grad_norm_total": total,
        "watch_total_grad_norm": checks,
        "max_relative_difference": max(
            abs(v - total) / max(abs(total), 1e-30) for v in checks.values()
        ),
    }

    rng = random.Random(1234)  # the same order on every rank
    max_rounds = max(case.min_rounds, round(case.rounds * scale))
    budget = case.budget_s * scale
    load_before = os.getloadavg()[0]
    for variant in DIST_VARIANTS:
        gc.collect()
        for _ in range(2):
            step(variant)
    times: dict[str, list[float]] = {v: [] for v in DIST_VARIANTS}
    every: dict[str, list[float]] = {v: [] for v in DIST_VARIANTS}
    ratios: dict[str, list[float]] = {v: [] for v in DIST_VARIANTS}
    costs: dict[str, list[float]] = {v: [] for v in DIST_VARIANTS}
    call_times: dict[str, list[float]] = {v: [] for v in DIST_VARIANTS}
    call_blocks: dict[str, list[float]] = {v: [] for v in DIST_VARIANTS}
    started = time.perf_counter()
    rounds = 0
    go = torch.ones(1)
    while True:
        # Rank 0's clock decides, for every rank: a rank stopping alone would hang the other.
        if rank == 0:
            elapsed = time.perf_counter() - started
            go.fill_(float(rounds < max_rounds and (rounds < case.min_rounds or elapsed < budget)))
        dist.broadcast(go, src=0)
        if not go.item():
            break
        order = list(DIST_VARIANTS)
        rng.shuffle(order)
        block = {}
        for variant in order:
            gc.collect()
            step(variant)  # untimed: the first step after switching variant
            calls.clear()
            measured = [step(variant) for _ in range(case.steps)]
            call_times[variant] += calls
            call_blocks[variant].append(statistics.median(calls))
            every[variant] += measured
            block[variant] = statistics.median(measured)
            times[variant].append(block[variant])
        for variant in DIST_VARIANTS:
            ratios[variant].append(block[variant] / block["plain"])
            costs[variant].append(block[variant] - block["plain"])
        rounds += 1
    elapsed = time.perf_counter() - started
    profiles = {}
    if profile:  # after the timed rounds: where the added calls' time goes, on rank 0
        import cProfile
        import io
        import pstats

        for variant, call in (
            ("gradscope", watch.collect),
            ("gradscope_detail1", watch_detail1.collect),
            ("clip", lambda loss: clip()),
        ):
            profiler = cProfile.Profile()
            for _ in range(PROFILE_CALLS):
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                profiler.enable()
                call(loss)
                profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(PROFILE_LINES)
            profiles[variant] = text.getvalue()
        optimizer.zero_grad(set_to_none=True)
    watch.close()
    watch_detail1.close()

    if rank == 0:
        plain_p10 = _quantile(sorted(every["plain"]), 0.1)
        result = {
            "description": case.description,
            "world_size": world,
            "backend": "gloo",
            "torch_threads_per_rank": threads,
            "parameters": sum(p.numel() for p in model.parameters()),
            "watched_layers": len(watch.layers),
            "rounds": rounds,
            "steps_per_block": case.steps,
            "seconds": round(elapsed, 1),
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "sanity": sanity,
            "variants": {},
        }
        if profiles:
            result["profile_rank0"] = profiles
        for variant in DIST_VARIANTS:
            r = sorted(ratios[variant])
            c = sorted(costs[variant])
            p10 = _quantile(sorted(every[variant]), 0.1)
            result["variants"][variant] = {
                "median_step_ms": round(statistics.median(times[variant]) * 1e3, 3),
                "p10_step_ms": round(p10 * 1e3, 3),
                "ratio_median": round(statistics.median(r), 4),
                "ratio_p25": round(_quantile(r, 0.25), 4),
                "ratio_p75": round(_quantile(r, 0.75), 4),
                "ratio_p10_steps": round(p10 / plain_p10, 4),
                # cost: this variant's block median minus plain's, same round
                "cost_ms_median": round(statistics.median(c) * 1e3, 3),
                "cost_ms_p25": round(_quantile(c, 0.25) * 1e3, 3),
                "cost_ms_p75": round(_quantile(c, 0.75) * 1e3, 3),
                "cost_ms_p10_steps": round((p10 - plain_p10) * 1e3, 3),
                # the added calls alone (collect, clip_grad_norm_), timed inside the step
                "call_ms_median": round(statistics.median(call_times[variant]) * 1e3, 3),
                "call_ms_p10": round(_quantile(sorted(call_times[variant]), 0.1) * 1e3, 3),
            }
        v = result["variants"]
        plain_ms = v["plain"]["median_step_ms"]
        for variant in DIST_VARIANTS:
            v[variant]["call_ratio"] = round(1 + v[variant]["call_ms_median"] / plain_ms, 4)
        for watch_variant in ("gradscope", "gradscope_detail1"):
            suffix = "" if watch_variant == "gradscope" else "_detail1"
            # The target, on the figure this machine resolves: the calls alone, timed in
            # the same steps (a whole FSDP step on gloo moves by more than both costs).
            result["meets_target" + suffix] = bool(
                v[watch_variant]["call_ms_median"] <= v["clip"]["call_ms_median"]
            )
            # Whole steps: per round, the watch's block median minus clip's.
            d = sorted(a - b for a, b in zip(times[watch_variant], times["clip"], strict=True))
            low, high = _quantile(d, 0.25), _quantile(d, 0.75)
            result["step_difference_ms" + suffix] = {
                "median": round(statistics.median(d) * 1e3, 3),
                "p25": round(low * 1e3, 3),
                "p75": round(high * 1e3, 3),
                "verdict": "within noise"
                if low < 0 < high
                else ("met" if statistics.median(d) <= 0 else "missed"),
            }
            # The calls: per round, the watch's block median minus clip's.
            d = sorted(
                a - b for a, b in zip(call_blocks[watch_variant], call_blocks["clip"], strict=True)
            )
            result["call_difference_ms" + suffix] = {
                "median": round(statistics.median(d) * 1e3, 3),
                "p25": round(_quantile(d, 0.25) * 1e3, 3),
                "p75": round(_quantile(d, 0.75) * 1e3, 3),
                "rounds_met": sum(x <= 0 for x in d),
            }
        Path(out, "result.json").write_text(json.dumps(result, indent=2))
    dist.barrier()
    dist.destroy_process_group()
    # Without Python's shutdown, where a gloo thread still releasing the last collective
    # (which holds ``go``) could abort this rank; CI saw it.
    leave(0)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_distributed_case(case: DistributedCase, scale: float, profile: bool = False) -> dict:
    """Runs ``case`` on DIST_WORLD spawned processes and returns rank 0's result; a rank that
    fails or hangs raises RuntimeError with what happened, within a bounded time."""
    import tempfile

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException, ProcessExitedException

    worker_seconds = case.budget_s * scale + DIST_JOIN_MARGIN_S
    with tempfile.TemporaryDirectory(prefix="gradscope-fsdp-bench-") as out:
        context = mp.start_processes(
            _fsdp_worker,
            args=(DIST_WORLD, _free_port(), case, scale, out, worker_seconds, profile),
            nprocs=DIST_WORLD,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + worker_seconds + 30
        try:
            while not context.join(timeout=5):
                if time.monotonic() > deadline:
                    for process in context.processes:
                        if process.is_alive():
                            process.kill()
                    raise RuntimeError(
                        f"{case.name}: the ranks did not finish within "
                        f"{worker_seconds + 30:.0f} s (hung); killed"
                    )
        except ProcessException as error:  # a rank raised, or died (its stacks above)
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            reason = str(error)
            if isinstance(error, ProcessExitedException):
                reason += (
                    f" (a rank still running after {worker_seconds:.0f} s dumps every thread's "
                    "stack on stderr, above, and exits with code 1)"
                )
            raise RuntimeError(f"{case.name}: rank {error.error_index} failed: {reason}") from None
        return json.loads(Path(out, "result.json").read_text())


# -- output ---------------------------------------------------------------------------
def print_table(results: dict, header: str) -> None:
    print(header)
    cols = (
        f"{'model':<12} {'variant':<15} {'step ms':>9} {'ratio':>7} {'p25-p75':>14} "
        f"{'p10 ms':>9} {'p10 ratio':>9}"
    )
    print(cols)
    print("-" * len(cols))
    for name, res in results.items():
        for variant in VARIANTS:
            v = res["variants"][variant]
            spread = f"{v['ratio_p25']:.3f}-{v['ratio_p75']:.3f}"
            print(
                f"{name:<12} {variant:<15} {v['median_step_ms']:>9.2f} "
                f"{v['ratio_median']:>6.3f}x {spread:>14} "
                f"{v['p10_step_ms']:>9.2f} {v['ratio_p10_steps']:>8.3f}x"
            )
        target = res["target_gradscope"]
        verdict = "met" if res["meets_target"] else "MISSED"
        verdict_p10 = "met" if res["meets_target_p10"] else "MISSED"
        load = res["load_average_1min"]
        if res.get("target_gradscope_detail1") is not None:
            met = "met" if res["meets_target_detail1"] else "MISSED"
            print(
                f"{'':<12} target: gradscope_detail1 <= {res['target_gradscope_detail1']}x: "
                f"{met} (median ratio)"
            )
        print(
            f"{'':<12} capture (gradscope / gradscope_no_capture, same round): "
            f"{res['capture_ratio_median']:.4f}x median, p25-p75 "
            f"{res['capture_ratio_p25']:.4f}-{res['capture_ratio_p75']:.4f}; over every step "
            f"{res['capture_ratio_pooled']:.4f}x (medians), {res['capture_ratio_p10']:.4f}x (p10)"
        )
        print(
            f"{'':<12} capture target <= {CAPTURE_TARGET}x, paired ({res['capture_pairs']} "
            f"pairs of steps): {res['capture_paired_ratio']:.4f}x, "
            f"{res['capture_paired_us']:+.1f} µs a step: "
            f"{'met' if res['meets_capture_target'] else 'MISSED'}"
        )
        early = res["early_warnings"]
        print(
            f"{'':<12} early_warnings / gradscope_no_capture: {early['amortised_ratio']:.4f}x "
            f"amortised over the schedule (target <= {early['target']}x: "
            f"{'met' if early['meets_target'] else 'MISSED'}); due steps "
            f"{early['due_ratio']:.4f}x ({early['due_steps']}), other steps "
            f"{early['other_ratio']:.4f}x ({early['other_steps']}); mean {early['mean_ratio']:.4f}x"
        )
        print(
            f"{'':<12} target: gradscope <= {target}x and below seed_hook: {verdict} "
            f"(median ratio), {verdict_p10} (p10 ratio)\n"
            f"{'':<12} {res['rounds']} rounds x {res['steps_per_block']} steps in "
            f"{res['seconds']} s; load average {load[0]} before, {load[1]} after"
        )
        print()


def print_distributed_table(results: dict, header: str) -> None:
    print(header)
    cols = (
        f"{'model':<18} {'variant':<18} {'step ms':>9} {'ratio':>7} {'p25-p75':>14} "
        f"{'cost ms':>8} {'p25-p75 ms':>14} {'p10 cost':>9} {'call ms':>8}"
    )
    print(cols)
    print("-" * len(cols))
    for name, res in results.items():
        for variant in DIST_VARIANTS:
            v = res["variants"][variant]
            spread = f"{v['ratio_p25']:.3f}-{v['ratio_p75']:.3f}"
            cost_spread = f"{v['cost_ms_p25']:.2f}-{v['cost_ms_p75']:.2f}"
            print(
                f"{name:<18} {variant:<18} {v['median_step_ms']:>9.2f} "
                f"{v['ratio_median']:>6.3f}x {spread:>14} {v['cost_ms_median']:>8.2f} "
                f"{cost_spread:>14} {v['cost_ms_p10_steps']:>9.2f} {v['call_ms_median']:>8.2f}"
            )
        v = res["variants"]
        clip = v["clip"]
        for watch_variant, suffix in (("gradscope", ""), ("gradscope_detail1", "_detail1")):
            w = v[watch_variant]
            verdict = "met" if res["meets_target" + suffix] else "MISSED"
            d = res["step_difference_ms" + suffix]
            c = res["call_difference_ms" + suffix]
            print(
                f"{'':<18} target: {watch_variant} cost <= clip_grad_norm_'s: {verdict} (calls "
                f"alone {w['call_ms_median']:.2f} vs {clip['call_ms_median']:.2f} ms, "
                f"{w['call_ratio']:.3f}x vs {clip['call_ratio']:.3f}x a plain step; per round "
                f"{c['p25']:.2f} to {c['p75']:.2f} ms more, met in {c['rounds_met']} of "
                f"{res['rounds']} rounds); whole steps: {d['verdict']} ({d['median']:.2f} ms "
                f"more, p25-p75 {d['p25']:.2f} to {d['p75']:.2f})"
            )
        sanity = res["sanity"]
        same = sanity["max_relative_difference"] <= SANITY_RELATIVE
        load = res["load_average_1min"]
        print(
            f"{'':<18} total grad norm: watch {sanity['watch_total_grad_norm']['gradscope']:.9g}"
            f", clip_grad_norm_ {sanity['clip_grad_norm_total']:.9g}: "
            f"{'equal' if same else 'DIFFERENT'} (relative difference "
            f"{sanity['max_relative_difference']:.1e})\n"
            f"{'':<18} {res['world_size']} ranks (gloo, {res['torch_threads_per_rank']} "
            f"thread each), rank 0's steps; {res['rounds']} rounds x "
            f"{res['steps_per_block']} steps in {res['seconds']} s; load average {load[0]} "
            f"before, {load[1]} after"
        )
        print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        nargs="*",
        help="subset of: mlp resnet18 many_layers many_layers_b8 vanishing transformer resnet50 "
        "fsdp2_mlp fsdp2_transformer",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="only the distributed cases (FSDP2 on 2 gloo processes: fsdp2_*)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="distributed cases: also profile (cProfile, rank 0) the watch's collect() and "
        "clip_grad_norm_, printed after the table",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply rounds and time budgets")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument(
        "--out",
        default=None,
        help="JSON path (default benchmarks/results/overhead-<device>.json, and "
        "overhead-fsdp2-cpu.json for the distributed cases)",
    )
    args = parser.parse_args(argv)

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", message=".*[Aa]nomaly [Dd]etection.*")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rng = random.Random(1234)

    machine = {
        "device": device.type,
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        ),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    header = (
        f"GradScope watch overhead on {device.type} ({machine['device_name'] or 'unknown'}), "
        f"torch {torch.__version__}, threads pinned: torch.set_num_threads({threads}), "
        f"{os.cpu_count()} cores"
    )
    print(header, flush=True)

    def wanted(name: str, distributed: bool) -> bool:
        if args.models:
            return name in args.models
        if distributed:  # FSDP2 on gloo: CPU processes, whatever --device says
            return args.distributed or device.type == "cpu"
        return not args.distributed

    results: dict[str, dict] = {}
    for case in cases(device):
        if wanted(case.name, False):
            print(f"  {case.name}: {case.description} ...", flush=True)
            results[case.name] = run_case(case, device, rng, args.scale)
    distributed: dict[str, dict] = {}
    if torch.distributed.is_available():
        for case in distributed_cases():
            if wanted(case.name, True):
                print(f"  {case.name}: {case.description} ...", flush=True)
                distributed[case.name] = run_distributed_case(case, args.scale, args.profile)
    elif args.distributed:
        print("torch.distributed is not available in this torch build", file=sys.stderr)
        return 1
    print()
    if results:
        print_table(results, header)
    if distributed:
        print_distributed_table(
            distributed,
            f"GradScope watch under FSDP2 (torch.distributed.fsdp.fully_shard) on cpu, "
            f"{DIST_WORLD} processes, gloo, torch {torch.__version__}, {os.cpu_count()} cores",
        )
        for name, res in distributed.items():
            for variant, text in res.get("profile_rank0", {}).items():
                print(f"{name}, {variant}: cProfile of {PROFILE_CALLS} calls on rank 0")
                print(text)
    common = {
        "command": "python benchmarks/overhead.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine,
        "ratio": "median over rounds of (variant block median step time / plain's, same round)",
        "ratio_p10_steps": "10th percentile of all the variant's step times / plain's",
    }
    single = {
        "cuda_sync_check": (
            "watch.launch() ran under torch.cuda.set_sync_debug_mode('error'): no sync"
            if device.type == "cuda"
            else "not run (no CUDA)"
        ),
        "models": results,
    }
    several = {
        "cost_ms": "median over rounds of (variant block median step time - plain's, same "
        "round), rank 0's steps",
        "cost_ms_p10_steps": "10th percentile of the variant's step times - plain's",
        "call_ms": "the added calls alone (collect(), clip_grad_norm_, reads_only), timed "
        "inside the same steps: the figure meets_target is judged on",
        "clip": "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) after backward",
        "distributed": distributed,
    }
    results_dir = ROOT / "benchmarks" / "results"
    if args.out:
        outputs = [(Path(args.out), {**common, **single, **several})]
    else:
        outputs = []
        if results:
            outputs.append((results_dir / f"overhead-{device.type}.json", {**common, **single}))
        if distributed:
            outputs.append((results_dir / "overhead-fsdp2-cpu.json", {**common, **several}))
    for out, payload in outputs:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    wrong = [
        name
        for name, res in distributed.items()
        if res["sanity"]["max_relative_difference"] > SANITY_RELATIVE
    ]
    if wrong:
        print(
            f"the watch's total grad norm differs from clip_grad_norm_'s in {wrong}: "
            "the figures above are not to be trusted",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
