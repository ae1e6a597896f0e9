"""One step's reads, the only path every step takes: queue the figures of every group
(:func:`launch`, no host synchronisation), then wait for the step's one transfer per device
and place each figure at its parameter (:func:`place`).

What a step asks for is all that differs between steps: every step reads each gradient's L2
figure (NaN and Inf propagate into it, so it flags non-finite gradients by itself); a detail
step (every ``detail_every``-th, and any step that goes wrong or changes a status) also reads
the registered detail statistics (gradscope.core.watch.statistics: the weights' norms, max
|g|, and any added there); a sharded group's figures are reduced over the ranks by the step's
one exchange, which also carries the per-rank facts.

How a group is read: a group of small tensors of one shape by one stacked batch in float64
(exact: no float32 square underflows or overflows); a group of large tensors by one fused
``_foreach_norm`` over its gradients, and each detail statistic's fused read. A large
gradient's float32 norm that may have lost squares to underflow is read again exactly
(gradscope.core.watch.exact), all such gradients in one fused read. Only parameters that have
a gradient are read: a frozen backbone costs nothing.

A device's figures travel as one vector: its single figures (0-d tensors) in one
``torch.stack``, and its whole vectors (stacked groups, the exchange) after them. The
layout of each group's figures is made once per kind of step and kept with the group. The
common step's placing and bookkeeping take a handful of numpy calls: after a backward the
caches are cold, and each call then costs microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import gradscope.core.watch.figures as tensor_reads
from gradscope.core.facts import RankFacts
from gradscope.core.sharded import FACT_SLOTS
from gradscope.core.tensor_tree import loss_from_output
from gradscope.core.watch.binding import Binding, ParameterGroup
from gradscope.core.watch.distributed import (
    fact_device,
    from_sharded,
    queue_sharded,
    rank_facts,
    read_rank_facts,
    shard_parts,
    sharded_width,
)
from gradscope.core.watch.figures import (
    accumulation_dtype,
    stacked_squares,
    tiny_bound,
    values_of,
)
from gradscope.core.watch.host import HostCopy, start_host_copy
from gradscope.core.watch.loss_scale import scale_tensor
from gradscope.core.watch.statistic_set import StatisticSet
from gradscope.core.watch.statistics import Statistic, StatisticError
from gradscope.core.watch.statistics.base import with_placeholders
from gradscope.core.watch.update_ratio import UpdateRatio


@dataclass
class ReadSetup:
    """What a watch's reads use beside its binding, the same for the watch's life: its
    statistics, its update ratio, its exchange with the other ranks (None without one) and
    the exchange's reduction kinds as a device tensor, made once per layout."""

    statistics: StatisticSet
    update: UpdateRatio
    exchange: Any = None
    _kinds: tuple[Any, torch.Tensor] | None = field(default=None, init=False, repr=False)

    def kinds_tensor(self, kinds: tuple[int, ...], device: torch.device) -> torch.Tensor:
        cached = self._kinds
        if cached is None or cached[0] != (kinds, device):
            cached = ((kinds, device), torch.tensor(kinds, dtype=torch.int8, device=device))
            self._kinds = cached
        return cached[1]


@dataclass
class Entry:
    """Where one group's figures sit in its device's vector.

    ``present``: positions (in the group) of the parameters that have a gradient this step,
    None when all of them do. Layout: the gradient figures (norms; sums of squares with
    ``grads_squared``: stacked and sharded groups), then each statistic read at this step,
    in ``reads`` order, ``(statistic, width)``: ``width`` slots per parameter, from the
    statistic's fused read (``fused``, a group of large tensors), its stacked one, or the
    sharded exchange (``sharded``). Unwatched entries hold gradient figures only (sums of
    squares with ``squared``). ``tiny``: the bound under which a float32 norm may have lost
    squares (0: exact). ``target``: where the figures go in the per-parameter arrays (a
    slice when the positions run on), made once with the entry.
    """

    kind: str
    group: ParameterGroup | None = None
    present: list[int] | None = None
    count: int = 0
    squared: bool = False
    tiny: float = 0.0
    grads_squared: bool = False
    # A detail step's entry also holds the detail statistics' figures.
    detail: bool = True
    reads: tuple[tuple[Statistic, int], ...] = ()
    fused: bool = False
    sharded: bool = False
    per_tensor: bool = False
    target: Any = None
    # Forward statistics' figures: (statistic name, layer index) of each slot.
    slots: tuple[tuple[str, int], ...] = ()

    def aim(self) -> Entry:
        """Work out where the figures go, once (entries are kept per kind of step)."""
        if self.group is None:
            return self
        indices = self.group.index_array
        if self.present is not None:
            indices = indices[self.present]
        self.target = _as_slice(indices)
        return self


def _as_slice(indices: np.ndarray) -> slice | np.ndarray:
    """A slice for positions that run on (cheaper to assign through), else the positions."""
    if len(indices) and indices[-1] - indices[0] == len(indices) - 1:
        if np.array_equal(indices, np.arange(indices[0], indices[-1] + 1)):
            return slice(int(indices[0]), int(indices[-1]) + 1)
    return indices


def _entry(group: ParameterGroup, key: Any, make: Any) -> Entry:
    """The group's entry for this kind of step, made and aimed the first time."""
    entry = group.entries.get(key)
    if entry is None:
        entry = group.entries[key] = make().aim()
    return entry


@dataclass
class Transfer:
    """One device's vector of figures on its way to the host, and what each slot is."""

    copy: HostCopy
    entries: list[Entry]


@dataclass
class Figures:
    """One read of the device figures, placed per parameter: the gradient norms, and the
    detail statistics read (``per_param``, by name; those a parameter keeps between steps,
    the weights', are in the watch's ``kept_figures``). ``has_grad`` is None when every
    parameter has a gradient."""

    param_norm: np.ndarray
    per_param: dict[str, np.ndarray] = field(default_factory=dict)
    has_grad: np.ndarray | None = None
    detail: bool = True
    unwatched_sq: float = 0.0
    unwatched_bad: list[tuple[ParameterGroup, list[int]]] = field(default_factory=list)
    imprecise: list[np.ndarray] = field(default_factory=list)
    loss: float | None = None
    scale: float | None = None
    ranks: RankFacts | None = None
    # Forward statistics: what each value is ((statistic name, layer index) per slot) and
    # the values, by device.
    outputs: list[tuple[tuple[tuple[str, int], ...], np.ndarray]] = field(default_factory=list)

    def with_grad(self) -> np.ndarray:
        """Per parameter, whether it has a gradient this step."""
        if self.has_grad is None:
            return np.ones(len(self.param_norm), dtype=bool)
        return self.has_grad


class _Device:
    """One device's pieces of the step's vector: single figures (0-d tensors: fused norms,
    aminmax pairs, the loss and the scale), stacked into one vector at the end, then whole
    vectors (stacked groups, the sharded exchange). Entries are kept in that order."""

    __slots__ = ("scalar_entries", "scalars", "vector_entries", "vectors")

    def __init__(self) -> None:
        self.scalars: list[torch.Tensor] = []
        self.scalar_entries: list[Entry] = []
        self.vectors: list[torch.Tensor] = []
        self.vector_entries: list[Entry] = []

    def vector(self) -> torch.Tensor:
        pieces = self.vectors
        if self.scalars:
            pieces = [torch.stack(self.scalars), *pieces]
        # In the widest dtype of its pieces (stack and cat promote: float32 norms beside
        # float64 sums of squares; a half-precision loss alone becomes float32).
        vector = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        if vector.dtype not in (torch.float32, torch.float64):
            vector = vector.float()
        return vector


def _present(group: ParameterGroup) -> tuple[list[int] | None, list, list]:
    """The group's parameters that have a gradient (positions, None for all), their
    gradients and the parameters themselves."""
    params = group.params
    grads = [p.grad for p in params]
    found = [g for g in grads if g is not None]
    if len(found) == len(grads):
        return None, grads, params
    present = [i for i, g in enumerate(grads) if g is not None]
    return present, found, [params[i] for i in present]


def _stacked_read(
    statistic: Statistic, grads: list, params: list, statistics: StatisticSet, where: Any
) -> torch.Tensor:
    """One value per parameter of a stacked group; zeros when the statistic fails (it is
    told to ``statistics``, and turned off after the step). Parameters it does not apply
    to (None) are told to ``statistics`` too, by ``where`` (the group and its present
    positions)."""
    try:
        values = statistic.stacked(grads, params)
        if isinstance(values, (list, tuple)):  # None where the statistic does not apply
            if len(values) != len(grads):
                raise StatisticError("did not give one value per parameter")
            found, absent = with_placeholders(list(values), grads[0])
            values = torch.stack(found)
            if absent:
                statistics.not_applicable(statistic, *where, absent)
        if not isinstance(values, torch.Tensor) or values.shape != (len(grads),):
            raise StatisticError("did not give one value per parameter")
        if values.device != grads[0].device or values.is_complex():
            raise StatisticError(f"gave a {values.dtype} tensor on {values.device}")
        return values.detach()
    except Exception as error:
        statistics.failed(statistic, error)
        return torch.zeros(len(grads), device=grads[0].device)


def _fused_read(
    statistic: Statistic,
    grads: list,
    params: list,
    statistics: StatisticSet,
    *,
    per_tensor: bool,
    sizes: tuple[int, ...] | None,
    where: Any = None,
) -> list[torch.Tensor]:
    """A statistic's 0-d figures of a group of large tensors; zeros when it fails. Those
    it does not apply to (None) are told to ``statistics`` by ``where``."""
    width = statistic.width(per_tensor) * len(grads)
    try:
        found = statistic.fused(grads, params, per_tensor=per_tensor, sizes=sizes)
        if len(found) != width:
            raise StatisticError("did not give one value per parameter")
        if statistic.name not in statistics.may_not_apply:
            return found
        found, absent = with_placeholders(found, grads[0])
        if absent:
            if width != len(grads):
                raise StatisticError("gave None in a batched read of more than one slot")
            statistics.not_applicable(statistic, *where, absent)
        return found
    except Exception as error:
        statistics.failed(statistic, error)
        return [torch.zeros((), device=grads[0].device)] * width


def _queue_stacked(
    group: ParameterGroup,
    present,
    grads: list,
    params: list,
    reads: tuple[Statistic, ...],
    device: _Device,
    statistics: StatisticSet,
) -> None:
    device.vectors.append(stacked_squares(grads))
    for statistic in reads:
        device.vectors.append(_stacked_read(statistic, grads, params, statistics, (group, present)))
    key = ("stacked", reads, None if present is None else tuple(present))
    device.vector_entries.append(
        _entry(
            group,
            key,
            lambda: Entry(
                "watched",
                group,
                present,
                count=len(grads),
                grads_squared=True,
                detail=bool(reads),
                reads=tuple((statistic, 1) for statistic in reads),
            ),
        )
    )


def _queue_large(
    group: ParameterGroup,
    present,
    grads: list,
    params: list,
    reads: tuple[Statistic, ...],
    device: _Device,
    statistics: StatisticSet,
) -> None:
    if group.sparse_capable:
        grads = [values_of(g) for g in grads]
    sample = grads[0]
    # One fused call reads the gradients' norms: plain and detail steps give the same
    # norms, bit for bit.
    device.scalars += torch._foreach_norm(grads, 2, dtype=accumulation_dtype(sample))
    per_tensor = bool(reads) and sample.device.type in tensor_reads.PER_TENSOR_DEVICES
    if reads:
        if group.sparse_capable:
            sizes = None
        elif present is None:
            sizes = group.sizes
        else:
            sizes = tuple(group.sizes[i] for i in present)
        for statistic in reads:
            device.scalars += _fused_read(
                statistic,
                grads,
                params,
                statistics,
                per_tensor=per_tensor,
                sizes=sizes,
                where=(group, present),
            )
    key = ("large", reads, None if present is None else tuple(present), per_tensor)
    device.scalar_entries.append(
        _entry(
            group,
            key,
            lambda: Entry(
                "watched",
                group,
                present,
                count=len(params),
                tiny=tiny_bound(sample),
                detail=bool(reads),
                reads=tuple((s, s.width(per_tensor)) for s in reads),
                fused=True,
                per_tensor=per_tensor,
            ),
        )
    )


def launch(
    binding: Binding,
    setup: ReadSetup,
    loss: Any,
    batch: Any,
    *,
    reads: tuple[Statistic, ...],
    facts: bool,
    unreduced: bool,
    scaler: Any = None,
    update_ratio: bool = False,
    sharded: bool = True,
    outputs: Any = None,
) -> list[Transfer]:
    """Queue the step's figures and their copies to the host: every gradient's norm, and
    the statistics of ``reads`` (those due at this step). ``facts``: the step's first read
    (the per-rank facts, the loss scale of ``scaler``, the update ratio's pending sums and
    the forward statistics' figures, ``outputs``, travel with it). ``unreduced``: the
    sharded groups hold each rank's own whole gradients (FSDP1 under ``no_sync()``).
    ``update_ratio``: the update ratio is measured (against the weights of a step that reads
    their norms). ``sharded=False``: leave the sharded groups out (a second read of a step,
    which must run no collective: their figures came complete with the first)."""
    return without_grad(
        _launch,
        binding,
        setup,
        loss,
        batch,
        reads=reads,
        facts=facts,
        unreduced=unreduced,
        scaler=scaler,
        update_ratio=update_ratio,
        sharded=sharded,
        outputs=outputs,
    )


_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


def without_grad(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` with autograd off, as under ``torch.no_grad()``, by the
    two calls that context makes: its object (or a decorator's, made anew at every call)
    costs some 10 Python calls a step, microseconds each with the caches cold."""
    before = _grad_enabled()
    _set_grad_enabled(False)
    try:
        return function(*args, **kwargs)
    finally:
        _set_grad_enabled(before)


def _launch(
    binding: Binding,
    setup: ReadSetup,
    loss: Any,
    batch: Any,
    *,
    reads: tuple[Statistic, ...],
    facts: bool,
    unreduced: bool,
    scaler: Any,
    update_ratio: bool,
    sharded: bool,
    outputs: Any,
) -> list[Transfer]:
    loss = None if loss is None else loss_from_output(loss)
    devices: dict[torch.device, _Device] = {}
    # Sharded figures, reduced over the ranks before the host transfer (one collective).
    shared: list[torch.Tensor] = []
    shared_kinds: list[int] = []
    shared_layout: list[Entry] = []
    update = setup.update
    exchange = setup.exchange
    if facts and update.slots:
        # The last optimizer step's update of sharded weights, reduced with this step's
        # figures. Every rank sends the same slots.
        count = update.send(shared, shared_kinds)
        shared_layout.append(Entry("update", count=count))
    statistics = setup.statistics
    if facts and statistics.absent:  # a new step: what its reads find not applicable
        statistics.absent.clear()
    # The update ratio is measured against the weight norms of its step.
    copy_weights = update_ratio and any(s.name == "weight_norm" for s in reads)
    # Without a sharded second read (mixed sharding, or each rank's own unreduced gradients:
    # statuses that may differ) sharded groups read what a step that goes wrong needs on
    # every step.
    sharded_reads = reads
    if binding.mixed_sharding or unreduced:
        sharded_reads = reads + statistics.trouble_reads(reads)
    if copy_weights:
        update.start()
    elif facts:
        update.clear()
    for group in binding.groups:
        if group.sharded:
            if not sharded:
                continue
            present, grads, params = shard_parts(group)
            if not grads:
                continue
            count = queue_sharded(
                group,
                grads,
                params,
                sharded_reads,
                shared,
                shared_kinds,
                reduce=not unreduced,
                statistics=statistics,
            )
            shared_layout.append(
                Entry(
                    "watched",
                    group,
                    present,
                    count,
                    grads_squared=True,
                    detail=bool(sharded_reads),
                    reads=tuple((s, sharded_width(s)) for s in sharded_reads),
                    sharded=True,
                ).aim()
            )
        else:
            present, grads, params = _present(group)
            if not grads:
                continue
            where = grads[0].device
            device = devices.get(where)
            if device is None:
                device = devices[where] = _Device()
            if group.stacked:
                _queue_stacked(group, present, grads, params, reads, device, statistics)
            else:
                _queue_large(group, present, grads, params, reads, device, statistics)
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
            queue_sharded(group, grads, [], (), shared, shared_kinds, reduce=not unreduced)
            if present is None:
                present = list(range(len(group.params)))
            shared_layout.append(Entry("unwatched", group, present, len(present), squared=True))
            continue
        present = [i for i, p in enumerate(group.params) if p.grad is not None]
        if not present:
            continue
        grads = [group.params[i].grad for i in present]
        where = grads[0].device
        device = devices.get(where)
        if device is None:
            device = devices[where] = _Device()
        if group.stacked:
            device.vectors.append(stacked_squares(grads))
            device.vector_entries.append(
                Entry("unwatched", group, present, len(present), squared=True)
            )
        else:
            if group.sparse_capable:
                grads = [values_of(g) for g in grads]
            device.scalars += torch._foreach_norm(grads, 2, dtype=accumulation_dtype(grads[0]))
            # norms, squared as they are placed
            device.scalar_entries.append(Entry("unwatched", group, present, len(present)))
    scale = scale_tensor(scaler) if facts else None
    if scale is not None:
        device = devices.setdefault(scale.device, _Device())
        device.scalars.append(scale.detach().reshape(()))
        device.scalar_entries.append(_SCALE)
    if loss is not None:
        # autograd is off here: the loss itself stacks without a graph
        value = loss if loss.ndim == 0 else loss.reshape(())
        device = devices.setdefault(loss.device, _Device())
        device.scalars.append(value.real if value.is_complex() else value)
        device.scalar_entries.append(_LOSS)
    if outputs:
        for where, (slots, values) in outputs.items():
            device = devices.setdefault(where, _Device())
            device.scalars += values
            device.scalar_entries.append(Entry("outputs", count=len(values), slots=slots))
    with_facts = facts and exchange is not None
    if shared or with_facts:
        fact_pieces = rank_facts(loss, batch, fact_device(exchange)) if with_facts else []
        where = (shared + fact_pieces)[0].device
        pieces = [*shared, torch.stack(fact_pieces)] if fact_pieces else shared
        vector = torch.cat([piece.to(where, torch.float64) for piece in pieces])
        if exchange is not None:
            vector = exchange.exchange(
                vector, setup.kinds_tensor(tuple(shared_kinds), where), len(fact_pieces)
            )
        # else (collectives=False): this rank's shards only, as the watch's docstring says
        device = devices.setdefault(where, _Device())
        device.vectors.append(vector)
        device.vector_entries += shared_layout
        if fact_pieces:
            device.vector_entries.append(Entry("ranks", count=exchange.world))
    return [
        Transfer(start_host_copy(device.vector()), device.scalar_entries + device.vector_entries)
        for device in devices.values()
    ]


_LOSS = Entry("loss")
_SCALE = Entry("scale")


def place(
    binding: Binding,
    kept: dict[str, np.ndarray],
    update: UpdateRatio,
    transfers: list[Transfer],
) -> Figures:
    """Wait for the copies (the step's one synchronisation) and place each figure at its
    parameter: gradient norms, and on detail steps the detail statistics (those a parameter
    keeps between steps, the weights', into ``kept``, by name; the update ratio's reduced
    sums go to ``update``)."""
    n_params = len(binding.params)
    param_norm = np.zeros(n_params)
    figures = Figures(param_norm)
    per_param = figures.per_param
    covered = 0
    targets = []
    for transfer in transfers:
        values = transfer.copy.wait()
        if values.dtype != np.float64:
            # widened once: every later numpy call runs on float64 (float32 loops would be
            # one more set of cold code after a backward, tens of microseconds a call)
            values = values.astype(np.float64)
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
                update.receive(binding, values[cursor : cursor + entry.count + 1])
                cursor += entry.count + 1
                continue
            if kind == "outputs":
                figures.outputs.append((entry.slots, values[cursor : cursor + entry.count]))
                cursor += entry.count
                continue
            if kind == "ranks":
                size = FACT_SLOTS * entry.count
                figures.ranks = read_rank_facts(
                    values[cursor : cursor + size], entry.count, FACT_SLOTS
                )
                cursor += size
                continue
            count = entry.count
            grad_figures = values[cursor : cursor + count]
            cursor += count
            if kind == "unwatched":
                if not entry.squared:
                    grad_figures = np.square(grad_figures, dtype=np.float64)
                squares = float(np.sum(grad_figures))
                if math.isfinite(squares):
                    figures.unwatched_sq += squares
                else:  # a real NaN/Inf, or only an overflowed sum: look closer
                    figures.unwatched_bad.append((entry.group, entry.present))
                continue
            target = entry.target
            if entry.grads_squared:
                grad_figures = np.sqrt(grad_figures)
            param_norm[target] = grad_figures
            covered += count
            targets.append(target)
            if not entry.detail:
                figures.detail = False
                # Without max |g|: a float32 norm this small, or 0, may have lost squares
                # that underflowed.
                if entry.tiny and np.minimum.reduce(grad_figures) < entry.tiny:
                    figures.imprecise.append(_positions(target)[grad_figures < entry.tiny])
                continue
            maxima = None
            for statistic, width in entry.reads:
                size = width * count
                raw = values[cursor : cursor + size]
                cursor += size
                if entry.fused:
                    found = statistic.from_fused(raw, entry.per_tensor)
                elif entry.sharded:
                    found = from_sharded(statistic, raw, count)
                else:
                    found = statistic.from_stacked(raw)
                name = statistic.name
                if statistic.kept:
                    store = kept.get(name)
                    if store is None:
                        store = kept[name] = np.zeros(n_params)
                else:
                    store = per_param.get(name)
                    if store is None:
                        store = per_param[name] = np.zeros(n_params)
                store[target] = found
                if name == "max_abs":
                    maxima = found
            if not entry.tiny or not count:
                continue
            if maxima is None:  # max |g| not read at this step: the norm says it
                if np.minimum.reduce(grad_figures) < entry.tiny:
                    figures.imprecise.append(_positions(target)[grad_figures < entry.tiny])
            elif np.minimum.reduce(maxima) < entry.tiny:
                # Squares of elements this small underflow: the sum is not exact.
                low = (maxima > 0) & (maxima < entry.tiny)
                if low.any():
                    figures.imprecise.append(_positions(target)[low])
    if covered != n_params:  # some parameters have no gradient (or were not read)
        has_grad = figures.has_grad = np.zeros(n_params, dtype=bool)
        for target in targets:
            has_grad[target] = True
    return figures


def _positions(target: slice | np.ndarray) -> np.ndarray:
    if isinstance(target, slice):
        return np.arange(target.start, target.stop)
    return target
