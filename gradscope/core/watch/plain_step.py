"""The common step in Python floats: every gradient's norm read, nothing else due, every
figure finite and every layer ok, as on the step before. Right after a backward pass numpy's
code is out of the caches and each of its reductions costs 10-30 µs (a small model's whole
watch cost is a few of them); one ``tolist()`` of the step's vector and a few Python loops over
some tens of floats cost less. The figures are those the numpy path gives, bit for bit: the
same float64 squares and square roots, and sums taken in numpy's own order (pairwise, as
``np.add.reduce`` and ``np.add.reduceat`` sum; checked against numpy once per process, and the
common step goes the numpy way if they ever differ).

A step that is anything else (a detail read, a NaN/Inf, a tiny norm, a status that is not ok or
was not ok at the step before, a loss scaler, several devices, the ranks' exchange) is left to
the general path (gradscope.core.watch.reads, norms, verdict), which this module never replaces:
it only says that the common step is one, and gives its figures.

What a step's layout means for this path is worked out once per layout (:func:`plan_for`) and
kept with the binding, so a rebind (new parameters, new layers) starts afresh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradscope.core.watch.binding import Binding

# numpy's pairwise summation: blocks of up to this many elements are summed in 8 running
# sums (numpy/_core/src/umath/loops_utils.h.src, PW_BLOCKSIZE).
_BLOCK = 128


def pairwise_sum(values: list[float], start: int, count: int) -> float:
    """Sum of ``values[start:start + count]`` in numpy's order for float64
    (``np.add.reduce`` of a contiguous array is this with ``start=0``; ``np.add.reduceat``'s
    segment is its first value plus this over the rest)."""
    if count < 8:
        total = 0.0
        for index in range(start, start + count):
            total += values[index]
        return total
    if count <= _BLOCK:
        r0, r1, r2, r3, r4, r5, r6, r7 = values[start : start + 8]
        index = start + 8
        whole = start + count - count % 8
        while index < whole:
            r0 += values[index]
            r1 += values[index + 1]
            r2 += values[index + 2]
            r3 += values[index + 3]
            r4 += values[index + 4]
            r5 += values[index + 5]
            r6 += values[index + 6]
            r7 += values[index + 7]
            index += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for index in range(whole, start + count):
            total += values[index]
        return total
    half = count // 2
    half -= half % 8
    return pairwise_sum(values, start, half) + pairwise_sum(values, start + half, count - half)


_matches_numpy: bool | None = None


def sums_match_numpy() -> bool:
    """Whether :func:`pairwise_sum` gives numpy's sums bit for bit here (checked once per
    process, on sizes around every branch of numpy's loop)."""
    global _matches_numpy
    if _matches_numpy is None:
        rng = np.random.default_rng(0)
        found = True
        for size in (*range(1, 42), 127, 128, 129, 136, 255, 300, 1031):
            data = rng.random(size) * 10.0 ** rng.integers(-8, 8, size)
            values = data.tolist()
            offsets = np.arange(0, size, 3)
            segments = np.add.reduceat(data, offsets).tolist()
            mine = [
                values[o] + pairwise_sum(values, o + 1, min(3, size - o) - 1)
                for o in offsets.tolist()
            ]
            if pairwise_sum(values, 0, size) != float(np.add.reduce(data)) or mine != segments:
                found = False
                break
        _matches_numpy = found
    return _matches_numpy


@dataclass
class PlainPlan:
    """How the common step reads one layout of the step's vector: ``size`` values;
    ``order``: each watched parameter's slot in it; ``rooted``: parameters whose slot holds
    a sum of squares (a stacked group's), not a norm; ``loss``: the loss's slot (None: no
    loss); ``tiny``: (first slot, end, bound) of each fused read whose norms below the bound
    may have lost squares; ``layers``: each layer's first parameter and parameter count
    (parameters in layer order); ``ok``: the statuses of a step whose layers are all ok, as
    the status tracker keeps them (bytes) and as an array to copy."""

    size: int
    order: list[int]
    rooted: list[int]
    loss: int | None
    tiny: list[tuple[int, int, float]]
    layers: list[tuple[int, int]]
    ok: bytes
    ok_status: np.ndarray


def plan_for(binding: Binding, entries: list[Any], ok_status: np.ndarray) -> PlainPlan | None:
    """The plan for a transfer's ``entries`` (see gradscope.core.watch.reads), kept with the
    binding; None when a step of this layout never takes the common path (detail reads,
    a loss scale, the ranks' exchange, unwatched gradients, parameters without a gradient,
    layers sharing or lacking parameters, float64 squares that may overflow)."""
    # Only layouts of entries the groups keep (a plain step's) are kept: a sharded,
    # unwatched or forward statistics' entry is made anew at each step, and keeping a plan
    # under its id would keep one per step.
    if binding.sharded or binding.wide or binding.has_empty_layers:
        return None
    if not binding.members_in_order or not sums_match_numpy():
        return None
    for entry in entries:
        if entry.kind not in _PLAIN_KINDS:
            return None
    key = tuple(id(entry) for entry in entries)
    plans = binding.plain_plans
    if key in plans:
        return plans[key]
    plan = plans[key] = _make_plan(binding, entries, ok_status)
    return plan


_PLAIN_KINDS = ("watched", "loss")


def _make_plan(binding: Binding, entries: list[Any], ok_status: np.ndarray) -> PlainPlan | None:
    n_params = len(binding.params)
    order = [-1] * n_params
    rooted: list[int] = []
    tiny: list[tuple[int, int, float]] = []
    loss = None
    cursor = 0
    for entry in entries:
        if entry.kind == "loss":
            loss = cursor
            cursor += 1
            continue
        if entry.kind != "watched" or entry.detail or entry.reads or entry.sharded:
            return None
        target = entry.target
        if isinstance(target, slice):
            positions = list(range(target.start, target.stop))
        else:
            positions = np.asarray(target).tolist()
        if len(positions) != entry.count:
            return None
        for offset, position in enumerate(positions):
            if order[position] != -1:
                return None
            order[position] = cursor + offset
            if entry.grads_squared:
                rooted.append(position)
        if entry.tiny and not entry.grads_squared:
            tiny.append((cursor, cursor + entry.count, entry.tiny))
        cursor += entry.count
    if -1 in order:  # a parameter without a gradient this step
        return None
    offsets = binding.offsets.tolist()
    sizes = binding.layer_sizes.tolist()
    return PlainPlan(
        size=cursor,
        order=order,
        rooted=rooted,
        loss=loss,
        tiny=tiny,
        layers=list(zip(offsets, sizes, strict=True)),
        ok=ok_status.tobytes(),
        ok_status=ok_status,
    )


@dataclass
class PlainFigures:
    """The common step's figures: per parameter its gradient norm, per layer its norm, the
    loss, and the watched gradients' whole sum of squares."""

    param_norm: list[float]
    grad_norm: list[float]
    loss: float | None
    watched_sq: float


def plain_figures(
    plan: PlainPlan,
    values: list[float],
    *,
    explode_threshold: float,
    vanish_threshold: float,
) -> PlainFigures | None:
    """The step's figures from its vector (``values``, as Python floats) when it is a
    common step: every figure and the loss finite, no norm a fused read may have read
    short, every layer's norm within the thresholds. None otherwise (the general path then
    reads the same vector)."""
    if len(values) != plan.size:
        return None
    param_norm = [values[slot] for slot in plan.order]
    for position in plan.rooted:
        param_norm[position] = math.sqrt(param_norm[position])
    squares = [norm * norm for norm in param_norm]
    watched_sq = pairwise_sum(squares, 0, len(squares))
    if not math.isfinite(watched_sq):
        return None
    for start, end, bound in plan.tiny:
        if min(values[start:end]) < bound:
            return None
    loss = None
    if plan.loss is not None:
        loss = values[plan.loss]
        if not math.isfinite(loss):
            return None
    grad_norm = []
    for first, count in plan.layers:
        if count == 2:  # the common layer: a weight and a bias
            total = squares[first] + squares[first + 1]
        else:
            total = squares[first] + pairwise_sum(squares, first + 1, count - 1)
        grad_norm.append(math.sqrt(total))
    if grad_norm and (min(grad_norm) < vanish_threshold or max(grad_norm) > explode_threshold):
        return None
    return PlainFigures(param_norm, grad_norm, loss, watched_sq)
