"""The common step in Python floats: every gradient's norm read, and on a detail step the
built-in detail (each weight's norm, each gradient's max |g|); no other statistic due, every
figure finite and every layer ok, as on the step before. Right after a backward pass numpy's
code is out of the caches and each of its reductions costs 10-30 µs (a small model's whole
watch cost is a few of them); one ``tolist()`` of the step's vector and a few Python loops over
some tens of floats cost less. The figures are those the numpy path gives, bit for bit: the
same float64 squares and square roots, maxima of the same values, and sums taken in numpy's
own order (pairwise, as ``np.add.reduce`` and ``np.add.reduceat`` sum; checked against numpy
once per process, and the common step goes the numpy way if they ever differ).

A step that is anything else (a statistic of the user's or a forward statistic due, a failed
read, a NaN/Inf, a tiny norm or max |g|, a status that is not ok or was not ok at the step
before, a loss scaler, several devices, the ranks' exchange, a parameter without a gradient)
is left to the general path (gradscope.core.watch.reads, norms, verdict, per_layer), which this
module never replaces: it only says that the common step is one, and gives its figures.

What a step's layout means for this path is worked out once per layout (:func:`plan_for`) and
kept with the binding, so a rebind (new parameters, new layers) starts afresh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscope.core.watch.binding import Binding
from gradscope.core.watch.statistics.max_abs import MaxAbs
from gradscope.core.watch.statistics.weight_norm import WeightNorm

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
    the status tracker keeps them (bytes) and as an array to copy.

    A detail step's built-in figures (None where the layout has none): ``weights``, each
    parameter's weight-norm slot (``weights_rooted``: those holding a sum of squares);
    ``maxima`` and ``maxima_high``, each parameter's max |g| slots: a CPU read's (min, max)
    pair, whose max |g| is the larger modulus, or one slot twice (a max |g|, never -0.0,
    is its own modulus); ``tiny_maxima``: (parameters, bound) of each fused read whose
    norms may have lost squares where a max |g| is below the bound."""

    size: int
    order: list[int]
    rooted: list[int]
    loss: int | None
    tiny: list[tuple[int, int, float]]
    layers: list[tuple[int, int]]
    ok: bytes
    ok_status: np.ndarray
    weights: list[int] | None = None
    weights_rooted: list[int] = field(default_factory=list)
    maxima: list[int] | None = None
    maxima_high: list[int] | None = None
    tiny_maxima: list[tuple[list[int], float]] = field(default_factory=list)


def plan_for(binding: Binding, entries: list[Any], ok_status: np.ndarray) -> PlainPlan | None:
    """The plan for a transfer's ``entries`` (see gradscope.core.watch.reads), kept with the
    binding; None when a step of this layout never takes the common path (reads of
    statistics other than the built-in detail, a loss scale, the ranks' exchange, unwatched
    gradients, parameters without a gradient, layers sharing or lacking parameters, float64
    squares that may overflow)."""
    # Only layouts of entries the groups keep (a plain or detail step's) are kept: a sharded,
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
    weights = [-1] * n_params
    maxima = [-1] * n_params
    maxima_high = [-1] * n_params
    plan = PlainPlan(0, order, [], None, [], [], ok_status.tobytes(), ok_status)
    cursor = 0
    for entry in entries:
        if entry.kind == "loss":
            plan.loss = cursor
            cursor += 1
            continue
        if entry.kind != "watched" or entry.sharded or entry.detail != bool(entry.reads):
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
                plan.rooted.append(position)
        norms = cursor
        cursor += entry.count
        maxima_read = False
        for statistic, width in entry.reads:
            # The built-in detail only, as its from_fused / from_stacked place it: a
            # statistic of any other kind (a user's) goes the general path.
            if type(statistic) is WeightNorm and width == 1:
                for offset, position in enumerate(positions):
                    weights[position] = cursor + offset
                    if not entry.fused:  # stacked: float64 sums of squares
                        plan.weights_rooted.append(position)
            elif type(statistic) is MaxAbs and width == (2 if entry.per_tensor else 1):
                maxima_read = True
                for offset, position in enumerate(positions):
                    maxima[position] = cursor + offset * width
                    maxima_high[position] = cursor + offset * width + width - 1
            else:
                return None
            cursor += width * entry.count
        if entry.tiny and maxima_read:
            plan.tiny_maxima.append((positions, entry.tiny))
        elif entry.tiny and not entry.grads_squared:
            plan.tiny.append((norms, norms + entry.count, entry.tiny))
    if -1 in order:  # a parameter without a gradient this step
        return None
    # Each detail figure read for every parameter or for none.
    if -1 in weights:
        if any(slot != -1 for slot in weights):
            return None
    else:
        plan.weights = weights
    if -1 in maxima:
        if any(slot != -1 for slot in maxima):
            return None
    else:
        plan.maxima = maxima
        plan.maxima_high = maxima_high
    offsets = binding.offsets.tolist()
    sizes = binding.layer_sizes.tolist()
    plan.size = cursor
    plan.layers = list(zip(offsets, sizes, strict=True))
    return plan


@dataclass
class PlainFigures:
    """The common step's figures: per parameter its gradient norm, per layer its norm, the
    loss, and the watched gradients' whole sum of squares; on a detail step also each
    parameter's weight norm, and per layer the weight norm and max |g| (None otherwise)."""

    param_norm: list[float]
    grad_norm: list[float]
    loss: float | None
    watched_sq: float
    weight_norm: list[float] | None = None
    layer_weight_norm: list[float] | None = None
    layer_max_abs: list[float] | None = None


def _layer_norms(squares: list[float], layers: list[tuple[int, int]]) -> list[float]:
    """Each layer's root of its parameters' summed squares, summed as ``np.add.reduceat``
    sums a segment (its first value, then the rest pairwise)."""
    found = []
    for first, count in layers:
        if count == 2:  # the common layer: a weight and a bias
            total = squares[first] + squares[first + 1]
        else:
            total = squares[first] + pairwise_sum(squares, first + 1, count - 1)
        found.append(math.sqrt(total))
    return found


def plain_figures(
    plan: PlainPlan,
    values: list[float],
    *,
    explode_threshold: float,
    vanish_threshold: float,
) -> PlainFigures | None:
    """The step's figures from its vector (``values``, as Python floats) when it is a
    common step: every figure and the loss finite (the weights' norms aside: they decide
    nothing), no norm a fused read may have read short, every layer's norm within the
    thresholds. None otherwise (the general path then reads the same vector)."""
    if len(values) != plan.size:
        return None
    take = values.__getitem__
    param_norm = list(map(take, plan.order))
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
    maxima = None
    if plan.maxima is not None:
        # Finite: the norms, read from the same gradients, are (a NaN or Inf element makes
        # its norm NaN or Inf), so Python's max() gives numpy's maximum here.
        # max |g| = the larger of |min| and |max| (of one slot twice: itself)
        maxima = [
            low if low > high else high
            for low, high in zip(
                map(abs, map(take, plan.maxima)),
                map(abs, map(take, plan.maxima_high)),
                strict=True,
            )
        ]
        for positions, bound in plan.tiny_maxima:
            # Squares of elements this small underflow: the general path reads them exactly.
            if min(map(maxima.__getitem__, positions)) < bound:
                return None
    grad_norm = _layer_norms(squares, plan.layers)
    if grad_norm and (min(grad_norm) < vanish_threshold or max(grad_norm) > explode_threshold):
        return None
    found = PlainFigures(param_norm, grad_norm, loss, watched_sq)
    if plan.weights is not None:
        weight_norm = list(map(take, plan.weights))
        for position in plan.weights_rooted:
            weight_norm[position] = math.sqrt(weight_norm[position])
        found.weight_norm = weight_norm
        found.layer_weight_norm = _layer_norms([norm * norm for norm in weight_norm], plan.layers)
    if maxima is not None:
        found.layer_max_abs = [
            maxima[first] if count == 1 else max(maxima[first : first + count])
            for first, count in plan.layers
        ]
    return found
