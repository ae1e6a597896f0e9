"""One step's reads, the only path every step takes: queue the figures of every group
(:func:`launch`, no host synchronisation), then wait for the step's one transfer per device
and place each figure at its parameter (:func:`place`).

What a step asks for is all that differs between steps: every step reads each gradient's L2
figure (NaN and Inf propagate into it, so it flags non-finite gradients by itself); a detail
step (every ``detail_every``-th, and any step that goes wrong or changes a status) also reads
max |g| and the weights' L2 figures; a sharded group's figures are reduced over the ranks by
the step's one exchange, which also carries the per-rank facts.

How a group is read: a group of small tensors of one shape by one stacked batch in float64
(exact: no float32 square underflows or overflows); a group of large tensors by fused
``_foreach_norm`` calls (ord 2 over the gradients, and on detail steps over the weights), and
max |g| by ``_foreach_norm`` ord inf, or on a CPU (where that is several times slower) by one
``aminmax`` per tensor. A large gradient's float32 norm that may have lost squares to underflow
is read again exactly (gradscope.core.watch.exact), all such gradients in one fused read. Only
parameters that have a gradient are read: a frozen backbone costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from gradscope.core.facts import RankFacts
from gradscope.core.origin import loss_from_output
from gradscope.core.sharded import FACT_SLOTS
from gradscope.core.watch import figures as tensor_reads
from gradscope.core.watch.binding import Binding, ParameterGroup
from gradscope.core.watch.distributed import (
    UnreducedCheck,
    queue_sharded,
    rank_facts,
    read_rank_facts,
    shard_parts,
)
from gradscope.core.watch.figures import (
    accumulation_dtype,
    stacked_max,
    stacked_squares,
    tiny_bound,
    values_of,
)
from gradscope.core.watch.host import HostCopy, start_host_copy
from gradscope.core.watch.loss_scale import scale_tensor
from gradscope.core.watch.update_ratio import UpdateRatio


class Reader(Protocol):
    """What the reads use of the watch that runs them (its binding, exchange, update
    ratio, loss scaler and the weight figures it keeps between steps)."""

    model: Any
    binding: Binding
    exchange: Any
    unreduced: bool
    check_unreduced: UnreducedCheck
    update: UpdateRatio
    update_ratio_enabled: bool
    scaler: Any
    weight_norm: np.ndarray

    def rebind(self) -> None: ...

    def fact_device(self) -> torch.device: ...

    def kinds_tensor(self, kinds: tuple[int, ...], device: torch.device) -> torch.Tensor: ...


@dataclass
class Entry:
    """Where one group's figures sit in its device's vector.

    ``present``: positions (in the group) of the parameters that have a gradient this step,
    None when all of them do. ``squared``: the weight figures (and an unwatched entry's
    gradient figures) are sums of squares, not norms; ``grads_squared``: so are the gradient
    figures (stacked and sharded groups). Layout: the gradient figures, then on detail steps
    the present weights', then per non-empty gradient its max |g|, or with ``pairs`` (a CPU's
    large tensors) its (min, max) from aminmax. Unwatched entries hold gradient figures only.
    ``tiny``: the bound under which a float32 figure may have lost squares (0: exact).
    """

    kind: str
    group: ParameterGroup | None = None
    present: list[int] | None = None
    count: int = 0
    nonempty: list[int] | None = None
    squared: bool = False
    pairs: bool = False
    tiny: float = 0.0
    grads_squared: bool = False
    # A detail step's entry also holds the weights' figures and max |g|.
    detail: bool = True


@dataclass
class Transfer:
    """One device's vector of figures on its way to the host, and what each slot is."""

    copy: HostCopy
    entries: list[Entry]


@dataclass
class Figures:
    """One read of the device figures, placed per parameter."""

    param_norm: np.ndarray
    param_max: np.ndarray
    has_grad: np.ndarray
    detail: bool = True
    unwatched_sq: float = 0.0
    unwatched_bad: list[tuple[ParameterGroup, list[int]]] = field(default_factory=list)
    imprecise: list[np.ndarray] = field(default_factory=list)
    loss: float | None = None
    scale: float | None = None
    ranks: RankFacts | None = None


def _present(group: ParameterGroup) -> tuple[list[int] | None, list, list]:
    """The group's parameters that have a gradient (positions, None for all), their
    gradients and the parameters themselves."""
    params = group.params
    grads = [p.grad for p in params]
    if all(g is not None for g in grads):
        return None, grads, params
    present = [i for i, g in enumerate(grads) if g is not None]
    return present, [grads[i] for i in present], [params[i] for i in present]


def _queue_stacked(grads: list, params: list, detail: bool, pieces: list) -> Entry:
    pieces.append(stacked_squares(grads))
    if detail:
        pieces.append(stacked_squares(params))
        pieces.append(stacked_max(grads))
    return Entry("watched", count=len(grads), squared=True, grads_squared=True, detail=detail)


def _queue_large(
    group: ParameterGroup, present, grads: list, params: list, detail: bool, pieces: list
) -> Entry:
    if group.sparse_capable:
        grads = [values_of(g) for g in grads]
    sample = grads[0]
    # One fused call reads the gradients' norms (and on detail steps the weights'): plain and
    # detail steps give the same norms, bit for bit.
    norms = torch._foreach_norm(
        grads + params if detail else grads, 2, dtype=accumulation_dtype(sample)
    )
    pieces.append(torch.stack(norms))
    nonempty = None
    pairs = detail and sample.device.type in tensor_reads.PER_TENSOR_DEVICES
    if detail and group.sparse_capable:  # a sparse gradient can store nothing
        nonempty = [k for k, g in enumerate(grads) if g.numel()]
        grads = [grads[k] for k in nonempty]
    elif detail and group.empty:
        positions = present if present is not None else range(len(group.params))
        nonempty = [k for k, i in enumerate(positions) if i not in group.empty]
        grads = [grads[k] for k in nonempty]
    if pairs and grads:
        # Max |g| on a CPU by one aminmax per gradient: there _foreach_norm's ord inf is
        # several times slower (measured: 2.4 ms against 0.15 ms on the benchmark's MLP).
        found = [torch.aminmax(g.abs() if g.is_complex() else g) for g in grads]
        pieces.append(torch.stack([v for pair in found for v in pair]))
    elif detail and grads:
        pieces.append(torch.stack(torch._foreach_norm(grads, float("inf"))))
    return Entry(
        "watched",
        count=len(params),
        nonempty=nonempty,
        pairs=pairs,
        tiny=tiny_bound(sample),
        detail=detail,
    )


def launch(
    watch: Reader,
    loss: Any,
    batch: Any,
    *,
    detail: bool,
    facts: bool,
    sharded: bool = True,
) -> list[Transfer]:
    """Queue the step's figures and their copies to the host. ``facts``: the step's first
    read (the per-rank facts, the loss scale, the update ratio's pending sums travel with
    it). ``sharded=False``: leave the sharded groups out (a second read of a step, which
    must run no collective: their figures came complete with the first)."""
    # A context, not torch.no_grad() as a decorator: the decorator makes a new context
    # object at every call (some 25 µs a step here).
    with torch.no_grad():
        return _launch(watch, loss, batch, detail=detail, facts=facts, sharded=sharded)


def _launch(
    watch: Reader,
    loss: Any,
    batch: Any,
    *,
    detail: bool,
    facts: bool,
    sharded: bool,
) -> list[Transfer]:
    loss = None if loss is None else loss_from_output(loss)
    if watch.binding.parameters_replaced(watch.model):
        watch.rebind()
    binding = watch.binding
    parts: dict[torch.device, list[torch.Tensor]] = {}
    layout: dict[torch.device, list[Entry]] = {}
    # Sharded figures, reduced over the ranks before the host transfer (one collective).
    shared: list[torch.Tensor] = []
    shared_kinds: list[int] = []
    shared_layout: list[Entry] = []
    update = watch.update
    if facts:
        watch.unreduced = watch.check_unreduced(
            [*binding.groups, *binding.unwatched_groups], watch.exchange
        )
    if facts and update.slots:
        # The last optimizer step's update of sharded weights, reduced with this step's
        # figures. Every rank sends the same slots.
        count = update.send(shared, shared_kinds)
        shared_layout.append(Entry("update", count=count))
    copy_weights = watch.update_ratio_enabled and detail
    if copy_weights:
        update.start()
    elif facts:
        update.clear()
    for group in binding.groups:
        if group.sharded:
            if not sharded:
                continue
            # Without sharded detail on a second read (mixed sharding, or each rank's own
            # unreduced gradients: statuses that may differ) every step has it.
            full = detail or binding.mixed_sharding or watch.unreduced
            present, grads, params = shard_parts(group)
            if not grads:
                continue
            count = queue_sharded(
                group, grads, params, full, shared, shared_kinds, reduce=not watch.unreduced
            )
            shared_layout.append(
                Entry(
                    "watched",
                    group,
                    present,
                    count,
                    squared=True,
                    grads_squared=True,
                    detail=full,
                )
            )
        else:
            present, grads, params = _present(group)
            if not grads:
                continue
            device = grads[0].device
            pieces = parts.setdefault(device, [])
            if group.stacked:
                entry = _queue_stacked(grads, params, detail, pieces)
            else:
                entry = _queue_large(group, present, grads, params, detail, pieces)
            entry.group, entry.present = group, present
            layout.setdefault(device, []).append(entry)
        if copy_weights:
            indices = group.index_array if present is None else group.index_array[present]
            update.copy(
                indices, params, group.replicas if group.sharded else 0, sharded=group.sharded
            )
    for group in binding.unwatched_groups:
        if group.sharded:
            if not sharded:
                continue
            present, grads, _ = shard_parts(group)
            if not grads:
                continue
            # The gradients' sums of squares alone, as a watched group's plain step.
            queue_sharded(group, grads, [], False, shared, shared_kinds, reduce=not watch.unreduced)
            if present is None:
                present = list(range(len(group.params)))
            shared_layout.append(Entry("unwatched", group, present, len(present), squared=True))
            continue
        present = [i for i, p in enumerate(group.params) if p.grad is not None]
        if not present:
            continue
        grads = [group.params[i].grad for i in present]
        device = grads[0].device
        if group.stacked:
            parts.setdefault(device, []).append(stacked_squares(grads))
        else:
            if group.sparse_capable:
                grads = [values_of(g) for g in grads]
            norms = torch._foreach_norm(grads, 2, dtype=accumulation_dtype(grads[0]))
            parts.setdefault(device, []).append(torch.stack(norms).double().square())
        layout.setdefault(device, []).append(
            Entry("unwatched", group, present, len(present), squared=True)
        )
    scale = scale_tensor(watch.scaler) if facts else None
    if scale is not None:
        parts.setdefault(scale.device, []).append(scale.detach().reshape(1))
        layout.setdefault(scale.device, []).append(Entry("scale"))
    if loss is not None:
        value = loss.detach().reshape(1)
        parts.setdefault(loss.device, []).append(value.real if value.is_complex() else value)
        layout.setdefault(loss.device, []).append(Entry("loss"))
    tails: dict[torch.device, torch.Tensor] = {}
    with_facts = facts and watch.exchange is not None
    if shared or with_facts:
        fact_pieces = rank_facts(loss, batch, watch.fact_device()) if with_facts else []
        device = (shared + fact_pieces)[0].device
        pieces = [*shared, torch.stack(fact_pieces)] if fact_pieces else shared
        vector = torch.cat([piece.to(device, torch.float64) for piece in pieces])
        if watch.exchange is not None:
            vector = watch.exchange.exchange(
                vector, watch.kinds_tensor(tuple(shared_kinds), device), len(fact_pieces)
            )
        # else (collectives=False): this rank's shards only, as the watch's docstring says
        tails[device] = vector
        layout.setdefault(device, []).extend(shared_layout)
        if fact_pieces:
            layout[device].append(Entry("ranks", count=watch.exchange.world))
    transfers = []
    for device, entries in layout.items():
        pieces = parts.get(device, [])
        if device in tails:
            pieces = [*pieces, tails[device]]
        # One vector per device, in the widest dtype of its pieces (cat promotes: float32
        # norms beside float64 sums of squares; a half-precision loss alone becomes float32).
        vector = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        if vector.dtype not in (torch.float32, torch.float64):
            vector = vector.float()
        transfers.append(Transfer(start_host_copy(vector), entries))
    return transfers


def place(watch: Reader, transfers: list[Transfer]) -> Figures:
    """Wait for the copies (the step's one synchronisation) and place each figure at its
    parameter: gradient norms, and on detail steps max |g| and weight norms."""
    n_params = len(watch.binding.params)
    figures = Figures(
        param_norm=np.zeros(n_params),
        param_max=np.zeros(n_params),
        has_grad=np.zeros(n_params, dtype=bool),
    )
    param_norm, param_max, has_grad = figures.param_norm, figures.param_max, figures.has_grad
    param_weight = watch.weight_norm
    for transfer in transfers:
        # float32 figures widen as they are placed into the float64 arrays
        values = transfer.copy.wait()
        cursor = 0
        for entry in transfer.entries:
            kind = entry.kind
            if kind == "loss":
                figures.loss = float(values[cursor])
                cursor += 1
                continue
            if kind == "scale":
                figures.scale = float(values[cursor])
                cursor += 1
                continue
            if kind == "update":
                watch.update.receive(watch.binding, values[cursor : cursor + entry.count + 1])
                cursor += entry.count + 1
                continue
            if kind == "ranks":
                size = FACT_SLOTS * entry.count
                figures.ranks = read_rank_facts(
                    values[cursor : cursor + size], entry.count, FACT_SLOTS
                )
                cursor += size
                continue
            group = entry.group
            count = entry.count
            grad_figures = values[cursor : cursor + count]
            cursor += count
            if kind == "unwatched":
                squares = float(np.sum(grad_figures))
                if math.isfinite(squares):
                    figures.unwatched_sq += squares
                else:  # a real NaN/Inf, or only an overflowed sum: look closer
                    figures.unwatched_bad.append((group, entry.present))
                continue
            indices = group.index_array
            if entry.present is not None:
                indices = indices[entry.present]
            if entry.grads_squared:
                grad_figures = np.sqrt(grad_figures)
            param_norm[indices] = grad_figures
            has_grad[indices] = True
            if not entry.detail:
                figures.detail = False
                if entry.tiny:
                    # Without max |g|: a float32 norm this small, or 0, may have lost squares
                    # that underflowed.
                    low = grad_figures < entry.tiny
                    if low.any():
                        figures.imprecise.append(indices[low])
                continue
            weights = values[cursor : cursor + count]
            cursor += count
            param_weight[indices] = np.sqrt(weights) if entry.squared else weights
            if entry.nonempty is not None:
                indices = indices[entry.nonempty]
            if entry.pairs:  # (min, max) per gradient
                pairs = values[cursor : cursor + 2 * len(indices)].reshape(-1, 2)
                cursor += 2 * len(indices)
                maxima = np.maximum(pairs[:, 1], -pairs[:, 0])
            else:
                maxima = values[cursor : cursor + len(indices)]
                cursor += len(indices)
            param_max[indices] = maxima
            if entry.tiny:
                # Squares of elements this small underflow: the sum is not exact.
                low = (maxima > 0) & (maxima < entry.tiny)
                if low.any():
                    figures.imprecise.append(indices[low])
    return figures
