"""The gradient watch: per-layer gradient statistics for every step, at the cost of a few
batched tensor ops and one host transfer per step.

No hooks are needed for the statistics themselves: after ``loss.backward()`` every watched
parameter's ``.grad`` is complete, so :meth:`GradientWatch.collect` reads them all at once,
grouped by device and dtype, stacks the results into one vector per device and copies it to
the host in a single transfer. Per-layer aggregation then happens in numpy on a few hundred
numbers. Norms of half-precision gradients accumulate in float32, so a finite fp16 gradient
never reports a false Inf.

Cost: each statistic is one read of the data (gradients twice: L2 and max |g|; weights once),
and max |g| and the weights are read only on detail steps (``detail_every``). The L2 figures
are one fused ``_foreach_norm`` call per group, gradients and weights together; max |g| is
another on CUDA and, on a CPU (where ``_foreach_norm``'s ord inf is several times slower), one
``aminmax`` per large gradient. A step where nothing happens takes a short path
(:meth:`GradientWatch._quiet_step`): right after a backward the CPU caches hold the model's
tensors, not the watch's Python, and every numpy call costs several times its warm figure.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gradscope.core.errors import GradScopeError
from gradscope.core.module_tree import select_layers
from gradscope.core.origin import Origin, float_tensors, loss_from_output
from gradscope.core.replay import DEFAULT_GRADIENT_BYTES, make_replay
from gradscope.core.safe_locate import locate_safely, statistics_origin
from gradscope.core.sharded import (
    FACT_SLOTS,
    KEEP,
    MAX,
    SUM,
    FlatShard,
    RankExchange,
    RankFacts,
    flat_shards,
    flattened_by_fsdp,
    full_numel,
    is_sharded,
    local,
    replicas,
)
from gradscope.core.user_warnings import warn_user
from gradscope.core.wrappers import named_layers, named_parameters, unwrap_model

# Ordered by severity, so the worst status of a layer over steps is their maximum: a layer
# that is frozen or got no gradient is less alarming than one that is ok.
# "skipped": the layer's scaled gradients overflowed on a step that the loss scaler skips (an
# expected event in mixed precision, not a failure).
(
    STATUS_FROZEN,
    STATUS_NO_GRADIENT,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_VANISHING,
    STATUS_EXPLODING,
    STATUS_NONFINITE,
) = range(7)
STATUS_NAMES = (
    "frozen",
    "no gradient",
    "ok",
    "skipped",
    "vanishing",
    "exploding",
    "nonfinite",
)

_HALF_DTYPES = (torch.float16, torch.bfloat16)
# By accumulation dtype: the max |g| under which squares underflow and a norm (torch's own
# included) loses precision or reads 0; such parameters are recomputed exactly in resolve.
_TINY = {torch.float32: 1e-15, torch.float64: 1e-140}
# Device types whose max |g| is read by one aminmax per (large) tensor rather than by the
# fused ``_foreach_norm`` ord inf; the tests also run the fused path on CPU by emptying this.
_PER_TENSOR_DEVICES: tuple[str, ...] = ("cpu",)
# Up to this many elements a tensor is "small": a CPU reads small tensors' max |g| with the
# fused call too, where its per-tensor cost (~1 µs) beats a Python-dispatched aminmax per
# tensor (~5 µs); above it aminmax's speed wins.
_SMALL_NUMEL = 4096
# Up to this many (parameter, layer) memberships, per-layer figures are summed by Python's
# arithmetic rather than numpy's (see GradientWatch._layer_norms); larger models have no
# quiet path (see GradientWatch._quiet_step).
_PYTHON_SUMS = 1024


@dataclass(frozen=True)
class LayerInfo:
    """A watched layer: a module and the parameters its statistics cover."""

    name: str
    type_name: str
    param_names: tuple[str, ...]
    num_params: int
    # Parameters this layer shares with a layer listed before it (tied weights): their
    # gradients are in this layer's statistics, their count is in the earlier layer's.
    tied: tuple[str, ...] = ()


@dataclass
class StepStats:
    """One step's statistics, as plain numpy (safe to send across threads and processes).

    Arrays are indexed like ``GradientWatch.layers`` (per layer) or
    ``GradientWatch.param_names`` (per parameter). ``update_ratio`` is None until the
    optimizer step it measures has run (and stays None when the option is off).
    ``origin``: where this step's NaN/Inf came from, on the first step of each NaN/Inf
    episode (None on every other step).
    """

    step: int
    loss: float | None
    total_grad_norm: float
    grad_norm: np.ndarray
    # None on steps without detail (see ``GradientWatch(detail_every=...)``).
    max_abs: np.ndarray | None
    weight_norm: np.ndarray | None
    nan_count: np.ndarray
    inf_count: np.ndarray
    status: np.ndarray
    param_grad_norm: np.ndarray
    update_ratio: np.ndarray | None = None
    loss_nonfinite: bool = False
    unwatched_nonfinite: bool = False
    origin: Origin | None = None
    # Mixed precision with a loss scaler (``watch(model, scaler=...)``): the scale of this
    # step; whether its scaled gradients overflowed so that the scaler skips it (an expected
    # event: not ``nonfinite``); whether the scale has collapsed (a real failure).
    loss_scale: float | None = None
    skipped: bool = False
    scale_collapsed: bool = False
    # Under torch.distributed: every rank's loss and whether its own batch or loss went
    # non-finite (``ranks.broken``), from the step's one all_gather.
    ranks: RankFacts | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def nonfinite(self) -> bool:
        """True when anything of this step, watched or not, is NaN or Inf (a step the loss
        scaler skips is not, unless the scale has collapsed)."""
        return (
            self.scale_collapsed
            or self.loss_nonfinite
            or self.unwatched_nonfinite
            or bool((self.status == STATUS_NONFINITE).any())
        )


def classify(
    grad_norm: np.ndarray,
    nonfinite_count: np.ndarray,
    explode_threshold: float,
    vanish_threshold: float,
) -> np.ndarray:
    """Status per layer: nonfinite beats exploding beats vanishing beats ok."""
    status = np.full(grad_norm.shape, STATUS_OK, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        status[grad_norm < vanish_threshold] = STATUS_VANISHING
        status[grad_norm > explode_threshold] = STATUS_EXPLODING
    status[(nonfinite_count > 0) | np.isnan(grad_norm)] = STATUS_NONFINITE
    return status


def is_flagged(status: np.ndarray | int) -> np.ndarray | bool:
    """Statuses worth an alarm: vanishing, exploding, nonfinite."""
    return np.asarray(status) >= STATUS_VANISHING


@dataclass
class _Group:
    """Parameters sharing a device and dtype when the watch was made: one batch of calls
    each. (Moving the model afterwards is fine: devices and dtypes are read again from the
    gradients at every step.) The lists are built once; only ``.grad`` is read per step."""

    indices: list[int]
    params: list[torch.Tensor]
    index_array: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    # Positions (in ``params``) of parameters with no elements: aminmax cannot reduce them.
    empty: frozenset[int] = frozenset()
    # Parameters of modules that can make sparse gradients (``nn.Embedding(sparse=True)``):
    # only these groups look at a gradient's layout.
    sparse_capable: bool = False
    # DTensor parameters (FSDP2) or FSDP1 flat views: each rank reads its shard; the figures
    # are reduced over the ranks (divided by ``replicas``, the ranks holding the same shard).
    sharded: bool = False
    replicas: int = 1
    # FSDP1: each parameter's unit (whether it got a gradient is the unit's to say).
    flat: list[FlatShard] | None = None
    # Tensors of at most _SMALL_NUMEL elements: max |g| by a fused call on a CPU too (for
    # thousands of small layers the per-tensor Python of aminmax dominates).
    small: bool = False

    def freeze(self) -> _Group:
        self.index_array = np.asarray(self.indices, dtype=np.intp)
        self.empty = frozenset(i for i, p in enumerate(self.params) if p.numel() == 0)
        return self


@dataclass
class _Entry:
    """Where one group's numbers sit in its device's vector (see ``GradientWatch.launch``).

    ``present``: positions (in the group) of the parameters that have a gradient this step,
    None when all of them do. ``squared``: the weight figures (and an unwatched sharded
    entry's gradient figures) are sums of squares, not norms; ``grads_squared``: so are the
    gradient figures (sharded groups). Layout: the gradient figures, then on detail steps
    the present weights', then per non-empty gradient its max |g|, or with ``pairs`` (a
    CPU's large tensors) its (min, max) from aminmax. Unwatched entries hold gradient
    figures only.
    """

    kind: str
    group: _Group | None = None
    present: list[int] | None = None
    count: int = 0
    nonempty: list[int] | None = None
    squared: bool = False
    pairs: bool = False
    tiny: float = 0.0
    # Watched gradient figures are norms, except a sharded group's sums of squares.
    grads_squared: bool = False
    # A detail step's entry also holds the weights' figures and max |g|.
    detail: bool = True


@dataclass
class _PendingUpdate:
    """An optimizer step's update under sharding, waiting for the next exchange: the stats
    it belongs to, the whole parameters' ||Δw|| (done), and per sharded group this rank's
    sums of squares of Δw with the group's replicas."""

    stats: StepStats
    delta: np.ndarray
    parts: list[tuple[np.ndarray, torch.Tensor, int]]


@dataclass
class _Figures:
    """One read of the device figures, placed per parameter (see ``GradientWatch._read``)."""

    param_norm: np.ndarray
    param_max: np.ndarray
    has_grad: np.ndarray
    detail: bool = True
    unwatched_sq: float = 0.0
    unwatched_bad: list[tuple[_Group, list[int]]] = field(default_factory=list)
    imprecise: list[np.ndarray] = field(default_factory=list)
    loss: float | None = None
    scale: float | None = None
    ranks: RankFacts | None = None


@dataclass(frozen=True)
class _QuietPlan:
    """How :meth:`GradientWatch.collect` reads a quiet step (see ``_quiet_step``): every
    parameter with ``requires_grad`` on one device, in one dtype, none sharded or sparse.
    ``params``: the watched ones in the watch's parameter order, then the unwatched ones."""

    params: list[torch.Tensor]
    watched: int
    device: torch.device
    grad_dtype: torch.dtype
    norm_dtype: torch.dtype | None
    tiny: float
    # Detail steps: the watched parameters whose max |g| is read by aminmax (a CPU's large
    # tensors), and the others (one fused call).
    large: list[int]
    small: list[int]
    # The unwatched groups' sizes: their sums of squares add up group by group, as in
    # resolve (the same total, bit for bit).
    unwatched: list[int]


def _norm_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    return torch.float32 if tensor.dtype in _HALF_DTYPES else None


def _host(tensor: torch.Tensor) -> np.ndarray:
    """A device tensor's values on the host by a non-blocking copy into pinned memory and an
    event: an explicit wait, not an implicit synchronisation inside an operation (which
    ``torch.cuda.set_sync_debug_mode("error")`` refuses)."""
    if tensor.device.type != "cuda":
        return tensor.numpy()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    event.synchronize()
    return host.numpy()


def _values(grad: torch.Tensor) -> torch.Tensor:
    """The numbers of a gradient: a sparse gradient's stored values, a complex one's moduli
    (so that max |g| and the NaN/Inf counts read what they say)."""
    grad = local(grad)
    if grad.layout != torch.strided:
        grad = grad.coalesce().values()
    return grad.abs() if grad.is_complex() else grad


def _squares(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sums of squares of several tensors as one float64 vector, by one fused call (empty
    tensors give 0; NaN and Inf propagate)."""
    norms = torch._foreach_norm(list(tensors), 2, dtype=_norm_dtype(tensors[0]))
    return torch.stack(norms).double().square()


def _square_sum(figures: list[float]) -> float:
    """The sum of the squares of a list of norms: by Python's arithmetic up to
    _PYTHON_SUMS of them, by numpy above (both paths of a step sum unwatched groups here, so
    their totals agree bit for bit)."""
    if len(figures) <= _PYTHON_SUMS:
        return sum([v * v for v in figures])
    return float(np.sum(np.square(np.asarray(figures, dtype=np.float64))))


class GradientWatch:
    """Collect per-layer gradient statistics after each backward pass, and say where each
    NaN/Inf came from.

    ``layers``: None (every module owning parameters, frozen ones included: their status is
    ``frozen`` until they are unfrozen), or module names / glob patterns. A selected module
    that owns no parameters of its own is watched over its whole subtree's parameters.
    Thresholds classify each layer as ok, vanishing (norm below ``vanish_threshold``),
    exploding (above ``explode_threshold``) or nonfinite; a layer whose parameters got no
    gradient this step is ``no gradient``, one whose parameters are all frozen ``frozen``.
    Statistics: each layer's gradient L2 norm (and each parameter's), the loss, the total
    norm, NaN/Inf detection and the status at every step; max |g|, the weight norm and the
    update ratio every ``detail_every``-th step (default 10; 1 for every step), and always
    on a step that goes non-finite or changes a layer's status. Steps without detail hold
    None there (never NaN, which means non-finite).
    ``update_ratio=True`` also measures ||Δw||/||w|| of each (detail) optimizer step; pass
    ``optimizer`` (or a list of them) so that happens by itself (otherwise call
    :meth:`measure_update` after ``optimizer.step()``); it costs a copy of the watched
    weights and one more transfer.

    ``model`` may be wrapped (DistributedDataParallel, DataParallel, ``torch.compile``):
    layer names are those of the model inside, and the diagnosis re-run calls that model
    directly (no collective, no recompilation).

    NaN/Inf: the first step of each NaN/Inf episode (a non-finite step after a finite one)
    gets ``stats.origin``. The step is re-run with instruments (module, op, line): through
    ``locate`` when given to :meth:`collect`, else by repeating the step the watch captured
    (``replay=True``, :mod:`gradscope.core.replay`; the gradient kept at the model's output
    is bounded by ``max_gradient_bytes``); at most ``max_located`` episodes are re-run per watch,
    each for at most ``locate_timeout`` seconds. The re-run never raises into the training
    loop and never runs a collective (see :mod:`gradscope.core.safe_locate`).

    ``scaler``: the ``torch.amp.GradScaler`` of a mixed-precision loop. Statistics are then
    of the true, unscaled gradients whether or not ``scaler.unscale_`` ran before
    :meth:`collect` (the reduced figures are divided by the scale: no extra pass), a step
    whose scaled gradients overflowed is ``stats.skipped`` (not a failure, no origin), and
    ``stats.loss_scale`` is the scale. A non-finite loss is still a failure (the scaler would
    skip it forever), and so is a scale that halves below ``scale_collapse_below`` (1.0).

    Under torch.distributed (DDP, FSDP2) every rank gets the whole model's statistics: DDP
    gradients are already all-reduced; FSDP2's sharded ones are reduced from each rank's
    shard with one ``all_gather`` of a small vector per step (never a gather of tensors). The
    same gather brings ``stats.ranks``: each rank's loss and whether its batch or loss went
    non-finite. Every rank must call :meth:`collect` at every step, as it calls
    ``backward``. A watch made on one rank only (``if rank == 0``) is noticed when it is made
    (through the process group's store, within 30 s) and then runs no collective; pass
    ``collectives=False`` to say so at once (no per-rank facts, and sharded statistics of
    this rank's shards only), or ``collectives=True`` to skip the check.

    ``record="runs/x.gsrec"`` adds a recording sink (``settings``: a JSON-able dict stored
    with it; ``overwrite=True`` replaces an existing recording, otherwise a new numbered name
    is chosen); ``sinks`` are further objects with ``on_step(watch, stats)`` and ``close()``.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: str | Iterable[str] | None = None,
        *,
        explode_threshold: float = 1000.0,
        vanish_threshold: float = 1e-7,
        update_ratio: bool = False,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        locate_timeout: float = 120.0,
        max_located: int = 20,
        scaler: Any = None,
        scale_collapse_below: float = 1.0,
        collectives: bool | None = None,
        detail_every: int = 10,
        record: str | os.PathLike[str] | None = None,
        settings: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        commit_seconds: float = 1.0,
        sinks: Sequence[Any] = (),
        replay: bool = True,
        max_gradient_bytes: int = DEFAULT_GRADIENT_BYTES,
    ) -> None:
        self.wrapped_model = model
        model = unwrap_model(model)
        self.model = model
        self.explode_threshold = float(explode_threshold)
        self.vanish_threshold = float(vanish_threshold)
        self.update_ratio_enabled = update_ratio
        self.locate_timeout = float(locate_timeout)
        self.max_located = int(max_located)
        self.scaler = scaler
        self.scale_collapse_below = float(scale_collapse_below)
        if int(detail_every) < 1:
            raise GradScopeError(f"detail_every must be >= 1, not {detail_every}")
        self.detail_every = int(detail_every)
        self._previous_status: np.ndarray | None = None
        self._previous_bytes: bytes | None = None
        if isinstance(layers, str):
            layers = [layers]
        self._layers_spec = None if layers is None else list(layers)
        # torch.distributed: statistics of sharded parameters and the per-rank facts travel
        # in one all_gather per step (see gradscope.core.sharded); none without it.
        if collectives is False:
            self._exchange = None
        else:
            self._exchange = RankExchange.current(verify=collectives is None)
        self._rank_facts = self._exchange is not None
        self._bind()
        if layers is not None and self.layers and not any(p.requires_grad for p in self._params):
            warn_user(
                f"gradscope.watch: layers={list(layers)!r} match only frozen layers "
                "(requires_grad=False); they show as frozen until they are unfrozen"
            )
        self._step = 0
        self._collected = 0  # steps collected by this watch (its step numbering may be set)
        # (indices, weights, their copies, replicas: 0 unless sharded) per group
        self._weights_before: list[tuple[np.ndarray, list, list[torch.Tensor], int]] | None = None
        # Under sharding, the update ratio's sums travel with the next step's exchange: how
        # many sharded slots it holds, and the measured sums waiting for it.
        self._update_slots = 0
        self._update_pending: _PendingUpdate | None = None
        # FSDP1 under no_sync(): each rank holds its own whole, unreduced gradients (see
        # _gradients_unreduced); then nothing of theirs is summed over the ranks.
        self._unreduced = False
        self._warned_unreduced = False
        self.last: StepStats | None = None
        self.origins: list[Origin] = []
        self._located = 0
        self._in_episode = False
        self._handles: list[Any] = []
        # gradscope.core.replay: what repeating a step without locate= needs (call site)
        self._replay = make_replay(model, enabled=replay, max_gradient_bytes=max_gradient_bytes)
        # The optimizers that write the weights: an "update" origin names them, and with
        # update_ratio their steps are measured. A runner that replaces its optimizer
        # updates this list.
        if optimizer is None:
            self.optimizers: list[torch.optim.Optimizer] = []
        elif isinstance(optimizer, (list, tuple)):
            self.optimizers = list(optimizer)
        else:
            self.optimizers = [optimizer]
        if update_ratio:
            for each in self.optimizers:
                self._handles.append(each.register_step_post_hook(lambda *_: self.measure_update()))
        self._sinks: list[Any] = list(sinks)
        self.recording: Any = None
        if record is not None:
            from gradscope.core.recording.sink import RecordingSink

            try:
                sink = RecordingSink(
                    self,
                    record,
                    settings,
                    overwrite=overwrite,
                    commit_seconds=commit_seconds,
                )
            except BaseException:
                self.close()
                raise
            self.recording = sink.writer
            self._sinks.append(sink)
        elif settings is not None:
            raise GradScopeError("settings= is stored in a recording; pass record= too")

    def _bind(self) -> None:
        """Find the watched layers and their parameters, and group them for the per-step
        reads. Run again when the model's parameters are replaced after ``watch()``
        (``fully_shard`` turns them into DTensors and changes the module's class; a model
        built on the meta device gets real ones from ``to_empty``; FSDP1 makes them views)."""
        model = self.model
        self._root_class = type(model)
        flat, unit_unknown = flat_shards(model)
        # The model's first parameter tells, at each step, whether the parameters were
        # replaced, moved or taken into FSDP1 units since: one look, not one per parameter.
        # Its owner and name too: a look in one dict, not a walk of the modules.
        owner = key = probe = None
        for module in model.modules():
            key = next((k for k, v in module._parameters.items() if v is not None), None)
            if key is not None:
                owner, probe = module, module._parameters[key]
                break
        self._probe = (
            owner,
            key,
            probe,
            None if probe is None else probe.device,
            probe is not None and flattened_by_fsdp(probe),
        )
        if unit_unknown:
            warn_user(
                "gradscope.watch: the watch was made on the model before FSDP wrapped it whole, "
                "and that wrapper is out of its reach: its parameters are read as a FULL_SHARD "
                "unit's, with this rank's parameter counts. Make the watch on the FSDP-wrapped "
                "model for exact sizes and HYBRID_SHARD"
            )
        if any(
            spec.handle is not None and spec.handle.flat_param._params is None
            for spec in flat.values()
        ):
            warn_user(
                "gradscope.watch: FSDP wrapped without use_orig_params=True, so each FSDP unit "
                "holds one flat parameter and GradScope's layers are those units; wrap with "
                "use_orig_params=True for per-layer statistics"
            )
        names = select_layers(model, self._layers_spec)
        modules = named_layers(model)
        qualified = named_parameters(model)
        sparse_capable = {
            id(p)
            for m in model.modules()
            if getattr(m, "sparse", False) is True
            for p in m.parameters(recurse=False)
        }

        self.layers: list[LayerInfo] = []
        self._params: list[torch.Tensor] = []
        self.param_names: list[str] = []
        index_of: dict[int, int] = {}
        owner: dict[int, str] = {}
        members: list[int] = []
        offsets: list[int] = []
        for name in names:
            module = modules[name]
            covered = list(module.parameters(recurse=False)) or list(module.parameters())
            offsets.append(len(members))
            tied = []
            for p in covered:
                if id(p) not in index_of:
                    index_of[id(p)] = len(self._params)
                    self._params.append(p)
                    self.param_names.append(qualified[id(p)])
                    owner[id(p)] = name
                elif owner[id(p)] != name:
                    tied.append(qualified[id(p)])
                members.append(index_of[id(p)])
            self.layers.append(
                LayerInfo(
                    name=name,
                    type_name=type(module).__name__,
                    param_names=tuple(qualified[id(p)] for p in covered),
                    num_params=sum(full_numel(p) for p in covered if qualified[id(p)] not in tied),
                    tied=tuple(tied),
                )
            )
        self._members = np.asarray(members, dtype=np.intp)
        self._offsets = np.asarray(offsets, dtype=np.intp)
        self._layer_sizes = np.diff(np.append(self._offsets, len(members)))
        # Each watched parameter in exactly one layer, in order: per-layer sums need no gather.
        self._members_in_order = np.array_equal(self._members, np.arange(len(self._params)))
        # Each layer's members (a slice when they are in order), for sums by Python's
        # arithmetic (see _layer_norms).
        spans = zip(offsets, [*offsets[1:], len(members)], strict=True)
        self._python_layers = (
            [slice(a, b) if self._members_in_order else members[a:b] for a, b in spans]
            if len(members) <= _PYTHON_SUMS
            else None
        )
        # Unwatched parameters still count towards the total norm when they have gradients,
        # so a NaN anywhere in the model is noticed even when only a few layers are watched.
        self._unwatched = [p for p in model.parameters() if id(p) not in index_of]
        self._groups = self._group(self._params, sparse_capable, flat)
        self._unwatched_groups = self._group(self._unwatched, sparse_capable, flat)
        every = (*self._groups, *self._unwatched_groups)
        if self._exchange is None:  # this rank's shards only: each counts once, as it is
            for group in every:
                group.replicas = 1
        self._sharded = any(g.sharded for g in every)
        # Sharded and whole parameters in one model (say, a module left out of FSDP): the
        # whole ones' figures are this rank's own, so a status decided from them may differ
        # between ranks, and a second read must not run a collective (see resolve).
        self._mixed_sharding = self._sharded and not all(g.sharded for g in every)
        self._replicas = np.zeros(len(self._params), dtype=np.int64)  # 0: not sharded
        for group in self._groups:
            if group.sharded:
                self._replicas[group.index_array] = group.replicas
        # Weight figures of parameters without a gradient are not read again each step
        # (a frozen backbone's weights do not change): the last ones read stand for them.
        self._weight_norm = self._read_weight_norms()
        self._quiet = self._quiet_plan(every, sparse_capable)

    def _quiet_plan(self, groups: Sequence[_Group], sparse_capable: set[int]) -> _QuietPlan | None:
        """The plan of :meth:`_quiet_step`, when this model allows one: every parameter
        trainable, non-empty and real, on one device and in one dtype, none sharded or
        sparse, and no exchange of figures with other ranks."""
        unwatched = [g.params for g in self._unwatched_groups]
        params = [*self._params, *(p for each in unwatched for p in each)]
        if (
            not params
            or self._exchange is not None
            or sparse_capable
            or any(g.sharded for g in groups)
            or not all(p.requires_grad and p.numel() and not p.is_complex() for p in params)
            or not (self._layer_sizes > 0).all()
            or self._python_layers is None  # many parameters: the full path's numpy pays
        ):
            return None
        device, dtype = params[0].device, params[0].dtype
        if device.type == "meta" or any(p.device != device or p.dtype != dtype for p in params):
            return None
        watched = len(self._params)
        # Max |g| as launch reads it: one aminmax per tensor of a CPU's groups of large
        # tensors, the fused call for the rest.
        per_tensor = device.type in _PER_TENSOR_DEVICES
        large = sorted(i for g in self._groups if per_tensor and not g.small for i in g.indices)
        small = sorted(set(range(watched)) - set(large))
        return _QuietPlan(
            params=params,
            watched=watched,
            device=device,
            grad_dtype=dtype,
            norm_dtype=torch.float32 if dtype in _HALF_DTYPES else None,
            tiny=_TINY[torch.float64 if dtype == torch.float64 else torch.float32],
            unwatched=[len(each) for each in unwatched],
            large=large,
            small=small,
        )

    # -- grouping ---------------------------------------------------------------------
    @staticmethod
    def _group(
        params: Sequence[torch.Tensor],
        sparse_capable: set[int],
        flat: Mapping[int, FlatShard],
    ) -> list[_Group]:
        groups: dict[tuple[torch.device, torch.dtype, bool, int, bool, bool], _Group] = {}
        for index, p in enumerate(params):
            sparse = id(p) in sparse_capable
            spec = flat.get(id(p))
            if spec is not None:
                copies = spec.replicas
            else:
                copies = replicas(p) if is_sharded(p) else 0  # 0: not sharded
            small = copies == 0 and p.numel() <= _SMALL_NUMEL
            key = (p.device, p.dtype, sparse, copies, small, spec is not None)
            if key not in groups:
                groups[key] = _Group(
                    [],
                    [],
                    sparse_capable=sparse,
                    sharded=copies > 0,
                    replicas=max(1, copies),
                    small=small,
                    flat=[] if spec is not None else None,
                )
            groups[key].indices.append(index)
            groups[key].params.append(p)
            if spec is not None:
                groups[key].flat.append(spec)
        return [group.freeze() for group in groups.values()]

    def _parameters_replaced(self) -> bool:
        """Whether the model's parameters changed since :meth:`_bind` (see there)."""
        owner, key, probe, device, flattened = self._probe
        if owner is None:
            return next(self.model.parameters(), None) is not None
        first = owner._parameters.get(key)
        if first is not probe:
            return True
        return first.device != device or (not flattened and flattened_by_fsdp(first))

    @torch.no_grad()
    def _read_weight_norms(self) -> np.ndarray:
        norms = np.zeros(len(self._params))
        for group in self._groups:
            if group.params[0].device.type == "meta":  # no values yet (deferred init)
                continue
            if group.sharded:
                squares = _squares([local(p) for p in group.params])
                squares = self._exchange_sum(squares) / group.replicas
                norms[group.index_array] = _host(squares.sqrt())
                continue
            values = torch._foreach_norm(group.params, 2, dtype=_norm_dtype(group.params[0]))
            norms[group.index_array] = _host(torch.stack(values).double())
        return norms

    def _exchange_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """A sum over ranks for sharded figures on rare steps (every rank gets here at the
        same step: the figures that send it here are reduced ones)."""
        if self._exchange is None:
            return tensor
        return self._exchange.all_reduce_sum(tensor)

    @property
    def step(self) -> int:
        """Index the next collected step will get."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        # A runner that replaces or rewinds its watch keeps the step numbering going; a
        # rewound run starts a new timeline, so a NaN after it is a new episode.
        self._step = int(value)
        self._in_episode = False
        self._previous_status = None
        self._previous_bytes = None

    @property
    def on_every_rank(self) -> bool:
        """Under torch.distributed, whether every rank made this watch (and so it exchanges
        figures and facts with them)."""
        return self._exchange is not None

    @property
    def first_origin(self) -> Origin | None:
        """The origin of the first NaN/Inf episode, or None."""
        return self.origins[0] if self.origins else None

    @property
    def path(self) -> Path | None:
        """The recording's path, when the watch records."""
        return self.recording.path if self.recording is not None else None

    # -- collection -------------------------------------------------------------------
    @torch.no_grad()
    def launch(
        self, loss: Any = None, *, batch: Any = None
    ) -> list[tuple[torch.Tensor, list, Any]]:
        """Queue every statistic's computation and the device-to-host copies; no host
        synchronisation happens here (checked on CUDA by the benchmark and tests).

        Every step: each gradient's L2 figure (NaN and Inf propagate into it, so it flags
        non-finite gradients by itself). Detail steps (every ``detail_every``-th) also read
        max |g| and the weights' L2 figures. All are 0-d tensors that one ``torch.stack``
        per device turns into the vector copied to the host.

        How a group of parameters (same device, dtype and size class) is read: fused
        ``_foreach_norm`` calls (ord 2 over gradients, and on detail steps over weights, and
        ord inf over gradients): one call for thousands of tensors, no per-tensor Python.
        On a CPU max |g| of large tensors is read instead by one ``aminmax`` each, since
        there ``_foreach_norm``'s ord inf is several times slower. Sums of squares that
        overflow or underflow float are recomputed exactly in
        :meth:`resolve` (rare steps only). Only parameters that have a gradient are read: a
        frozen backbone costs nothing.
        """
        return self._launch(loss, batch, detail=self._detail_due(), facts=True)

    def _detail_due(self) -> bool:
        return self._step % self.detail_every == 0

    def _launch(
        self, loss: Any, batch: Any, *, detail: bool, facts: bool, sharded: bool = True
    ) -> list[tuple[torch.Tensor, list, Any]]:
        """``sharded=False``: leave the sharded groups out (the second read of a step, which
        must run no collective: their figures came complete with the first)."""
        loss = None if loss is None else loss_from_output(loss)
        if type(self.model) is not self._root_class or self._parameters_replaced():
            self._bind()
        parts: dict[torch.device, list[torch.Tensor]] = {}
        layout: dict[torch.device, list[_Entry]] = {}
        # Sharded figures, reduced over the ranks before the host transfer (one collective).
        shared: list[torch.Tensor] = []
        shared_kinds: list[int] = []
        shared_layout: list[_Entry] = []
        if facts:
            self._unreduced = self._gradients_unreduced()
        if facts and self._update_slots:
            # The last optimizer step's update of sharded weights, reduced with this step's
            # figures (no collective in the optimizer hook: a rank whose step was skipped
            # would leave the others waiting there). Every rank sends the same slots.
            self._send_update(shared, shared_kinds, shared_layout)
        copy_weights = self.update_ratio_enabled and detail
        if facts or copy_weights:
            self._weights_before = [] if copy_weights else None
        for group in self._groups:
            if group.sharded:
                if not sharded:
                    continue
                # Without sharded detail on a second read (mixed sharding, or each rank's own
                # unreduced gradients: statuses that may differ) every step has it.
                full = detail or self._mixed_sharding or self._unreduced
                present, grads, params = self._shard_parts(group)
                if not grads:
                    continue
                count = self._launch_sharded(
                    group, grads, params, full, shared, shared_kinds, reduce=not self._unreduced
                )
                shared_layout.append(
                    _Entry(
                        "watched",
                        group,
                        present,
                        count,
                        squared=True,
                        grads_squared=True,
                        detail=full,
                    )
                )
                if copy_weights:
                    indices = group.index_array if present is None else group.index_array[present]
                    self._weights_before.append(
                        (indices, params, torch._foreach_mul(params, 1.0), group.replicas)
                    )
                    if self._exchange is not None:
                        self._update_slots += len(params)
                continue
            params = group.params
            grads = [p.grad for p in params]
            present = None
            if any(g is None for g in grads):
                present = [i for i, g in enumerate(grads) if g is not None]
                if not present:
                    continue
                grads = [grads[i] for i in present]
                params = [params[i] for i in present]
            if group.sparse_capable:
                grads = [_values(g) for g in grads]
            sample = grads[0]
            device = sample.device
            pieces = parts.setdefault(device, [])
            norm_dtype = _norm_dtype(sample)
            # One fused call reads the gradients' norms (and on detail steps the weights'):
            # plain and detail steps give the same norms, bit for bit.
            pieces += torch._foreach_norm(grads + params if detail else grads, 2, dtype=norm_dtype)
            nonempty = None
            # Max |g| on a CPU by one aminmax per gradient: there _foreach_norm's ord inf is
            # several times slower (measured: 2.4 ms against 0.15 ms on the benchmark's
            # MLP). Small tensors keep the fused call (for thousands of them one call's
            # per-tensor cost beats a Python-dispatched call each).
            pairs = detail and device.type in _PER_TENSOR_DEVICES and not group.small
            if detail and group.sparse_capable:  # a sparse gradient can store nothing
                nonempty = [k for k, g in enumerate(grads) if g.numel()]
                grads = [grads[k] for k in nonempty]
            elif detail and group.empty:
                positions = present if present is not None else range(len(group.params))
                nonempty = [k for k, i in enumerate(positions) if i not in group.empty]
                grads = [grads[k] for k in nonempty]
            if pairs:
                for g in grads:
                    pieces += torch.aminmax(g.abs() if g.is_complex() else g)
            elif detail and grads:
                pieces += torch._foreach_norm(grads, float("inf"))
            layout.setdefault(device, []).append(
                _Entry(
                    "watched",
                    group,
                    present,
                    len(params),
                    nonempty,
                    pairs=pairs,
                    tiny=_TINY[torch.float64 if sample.dtype == torch.float64 else torch.float32],
                    detail=detail,
                )
            )
            if copy_weights:
                indices = group.index_array if present is None else group.index_array[present]
                self._weights_before.append((indices, params, torch._foreach_mul(params, 1.0), 0))
        for group in self._unwatched_groups:
            if group.sharded:
                if not sharded:
                    continue
                present, grads, _ = self._shard_parts(group)
                if not grads:
                    continue
                # The gradients' sums of squares alone, as a watched group's plain step.
                self._launch_sharded(
                    group, grads, [], False, shared, shared_kinds, reduce=not self._unreduced
                )
                if present is None:
                    present = list(range(len(group.params)))
                shared_layout.append(
                    _Entry("unwatched", group, present, len(present), squared=True)
                )
                continue
            present = [i for i, p in enumerate(group.params) if p.grad is not None]
            if not present:
                continue
            grads = [group.params[i].grad for i in present]
            if group.sparse_capable:
                grads = [_values(g) for g in grads]
            # One fused call, as a plain step reads watched gradients (the quiet path reads
            # them so too: both give the same total).
            device = grads[0].device
            parts.setdefault(device, []).extend(
                torch._foreach_norm(grads, 2, dtype=_norm_dtype(grads[0]))
            )
            layout.setdefault(device, []).append(_Entry("unwatched", group, present, len(present)))
        scale = self._scale_tensor() if facts else None
        if scale is not None:
            parts.setdefault(scale.device, []).append(scale.detach().reshape(()).float())
            layout.setdefault(scale.device, []).append(_Entry("scale"))
        if loss is not None:
            device = loss.device
            value = loss.detach().reshape(())
            parts.setdefault(device, []).append(value.real if value.is_complex() else value)
            layout.setdefault(device, []).append(_Entry("loss"))
        tails: dict[torch.device, torch.Tensor] = {}
        with_facts = facts and self._rank_facts
        if shared or with_facts:  # with_facts: only with an exchange
            fact_pieces = self._facts(loss, batch) if with_facts else []
            device = (shared + fact_pieces)[0].device
            pieces = [*shared, torch.stack(fact_pieces)] if fact_pieces else shared
            vector = torch.cat([piece.to(device, torch.float64) for piece in pieces])
            if self._exchange is not None:
                vector = self._exchange.exchange(
                    vector, self._kinds_tensor(tuple(shared_kinds), device), len(fact_pieces)
                )
            # else (collectives=False): this rank's shards only, as the docstring says
            tails[device] = vector
            layout.setdefault(device, []).extend(shared_layout)
            if fact_pieces:
                layout[device].append(_Entry("ranks", count=self._exchange.world))
        transfers = []
        for device in layout:
            pieces = parts.get(device, [])
            vector = torch.stack(pieces) if pieces else None
            if device in tails:
                vector = tails[device] if vector is None else torch.cat([vector, tails[device]])
            if vector.dtype not in (torch.float32, torch.float64):
                vector = vector.float()
            if vector.device.type != "cpu":
                host = torch.empty(vector.shape, dtype=vector.dtype, pin_memory=True)
                host.copy_(vector, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                transfers.append((host, layout[device], event))
            else:
                transfers.append((vector, layout[device], None))
        return transfers

    def _read(self, transfers: list) -> _Figures:
        """Wait for the copies (the step's one synchronisation) and place each figure at its
        parameter: gradient norms, and on detail steps max |g| and weight norms."""
        n_params = len(self._params)
        figures = _Figures(
            param_norm=np.zeros(n_params),
            param_max=np.zeros(n_params),
            has_grad=np.zeros(n_params, dtype=bool),
        )
        param_norm, param_max, has_grad = figures.param_norm, figures.param_max, figures.has_grad
        param_weight = self._weight_norm
        for host, entries, event in transfers:
            if event is not None:
                event.synchronize()
            values = host.numpy().astype(np.float64)
            cursor = 0
            for entry in entries:
                if entry.kind == "loss":
                    figures.loss = float(values[cursor])
                    cursor += 1
                    continue
                if entry.kind == "scale":
                    figures.scale = float(values[cursor])
                    cursor += 1
                    continue
                if entry.kind == "update":
                    self._receive_update(values[cursor : cursor + entry.count + 1])
                    cursor += entry.count + 1
                    continue
                if entry.kind == "ranks":
                    per_rank = values[cursor : cursor + FACT_SLOTS * entry.count]
                    per_rank = per_rank.reshape(entry.count, FACT_SLOTS)
                    cursor += FACT_SLOTS * entry.count
                    figures.ranks = RankFacts(
                        loss=per_rank[:, 0],
                        loss_given=per_rank[:, 1] > 0,
                        batch_nonfinite=per_rank[:, 2] > 0,
                    )
                    continue
                group = entry.group
                count = entry.count
                grad_figures = values[cursor : cursor + count]
                cursor += count
                if entry.kind == "unwatched":
                    squares = (
                        float(np.sum(grad_figures))
                        if entry.squared
                        else _square_sum(grad_figures.tolist())
                    )
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
                        # Without max |g|: a norm this small may have lost squares that
                        # underflowed (an exact zero needs no second look).
                        low = (grad_figures > 0) & (grad_figures < entry.tiny)
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

    @torch.no_grad()
    def resolve(
        self,
        transfers: list,
        *,
        locate: Callable[[], Any] | None = None,
        batch: Any = None,
    ) -> StepStats:
        """Wait for the copies queued by :meth:`launch` (the step's one synchronisation),
        turn them into per-layer numpy statistics, find the origin of a new NaN/Inf episode
        and hand the step to the sinks."""
        figures = self._read(transfers)
        n_params = len(self._params)
        param_norm, param_max, has_grad = figures.param_norm, figures.param_max, figures.has_grad
        unwatched_sq = figures.unwatched_sq
        nan_per_param = np.zeros(n_params, dtype=np.int64)
        inf_per_param = np.zeros(n_params, dtype=np.int64)
        suspicious = ~(np.isfinite(param_norm) & np.isfinite(param_max))
        counted = bool(suspicious.any())
        if counted:
            self._count_nonfinite(
                np.flatnonzero(suspicious), param_norm, nan_per_param, inf_per_param
            )
        if figures.imprecise:
            # One host read for all of them (a vanishing step flags many parameters).
            flagged = np.concatenate(figures.imprecise)
            param_norm[flagged] = self._exact_norms(flagged)
        if figures.unwatched_bad:
            unwatched_sq += self._unwatched_squares(figures.unwatched_bad)
        divisor = unwatched_divisor = 1.0
        if figures.scale is not None:
            # Gradients still scaled by the loss scaler: the true ones are 1/scale of them.
            divisor, unwatched_divisor = self._scale_divisors(figures.scale)
            with np.errstate(invalid="ignore", over="ignore"):
                param_norm = param_norm / divisor
                unwatched_sq = unwatched_sq / unwatched_divisor**2

        members, offsets = self._members, self._offsets
        with np.errstate(over="ignore", invalid="ignore"):
            if len(offsets):
                grad_norm, watched_sq = self._layer_norms(param_norm)
                if counted:
                    nan_count = np.add.reduceat(nan_per_param[members], offsets)
                    inf_count = np.add.reduceat(inf_per_param[members], offsets)
                else:  # the common step: nothing to count
                    nan_count = np.zeros(len(offsets), dtype=np.int64)
                    inf_count = np.zeros(len(offsets), dtype=np.int64)
                if has_grad.all():
                    with_grad = self._layer_sizes
                else:
                    with_grad = np.add.reduceat(has_grad[members].astype(np.intp), offsets)
            else:
                grad_norm = np.zeros(0)
                watched_sq = float(np.sum(np.square(param_norm)))
                nan_count = inf_count = with_grad = np.zeros(0, dtype=np.int64)
            total = float(np.sqrt(watched_sq + unwatched_sq))
        status = classify(
            grad_norm, nan_count + inf_count, self.explode_threshold, self.vanish_threshold
        )
        without = np.flatnonzero(with_grad == 0)
        if len(without):
            status[without] = self._absent_status(without)
        loss_value = figures.loss
        loss_nonfinite = loss_value is not None and not np.isfinite(loss_value)
        unwatched_nonfinite = not np.isfinite(unwatched_sq)
        skipped = collapsed = False
        if figures.scale is not None:
            overflowed = status == STATUS_NONFINITE
            skipped = bool(overflowed.any()) or unwatched_nonfinite
            # A finite loss whose scaled gradients overflowed: the scaler skips the step and
            # halves the scale, as designed. Below the collapse threshold it never recovers.
            collapsed = skipped and figures.scale < self.scale_collapse_below
            if skipped and not loss_nonfinite and not collapsed:
                status[overflowed] = STATUS_SKIPPED
                unwatched_nonfinite = False
        # Decided from the statuses alone under sharding: every rank then takes the same
        # decision (the second read exchanges figures); a rank's own loss could differ.
        trouble = not self._sharded and (loss_nonfinite or unwatched_nonfinite or collapsed)
        changed = self._previous_status is None or not np.array_equal(status, self._previous_status)
        if not figures.detail and (trouble or changed or (status == STATUS_NONFINITE).any()):
            # A step that goes wrong or changes status always gets the detail: read it now.
            # Sharded groups too (one more collective), when every rank takes this decision
            # from the same reduced figures; with mixed sharding they had it already.
            again = self._read(
                self._launch(
                    None,
                    None,
                    detail=True,
                    facts=False,
                    sharded=not (self._mixed_sharding or self._unreduced),
                )
            )
            param_max = np.where(again.has_grad, again.param_max, param_max)
            figures.detail = True
        self._previous_status = status
        self._previous_bytes = status.tobytes()
        max_abs = weight_norm = None
        if figures.detail:
            with np.errstate(over="ignore", invalid="ignore"):
                param_max = param_max / divisor
                if len(offsets):
                    max_abs = self._layer_max(param_max)
                    weight_norm = self._layer_norms(self._weight_norm)[0]
                else:
                    max_abs = weight_norm = np.zeros(0)
        stats = StepStats(
            step=self._step,
            loss=loss_value,
            total_grad_norm=total,
            grad_norm=grad_norm,
            max_abs=max_abs,
            weight_norm=weight_norm,
            nan_count=nan_count,
            inf_count=inf_count,
            status=status,
            param_grad_norm=param_norm,
            loss_nonfinite=loss_nonfinite,
            unwatched_nonfinite=unwatched_nonfinite,
            loss_scale=figures.scale,
            skipped=skipped,
            scale_collapsed=collapsed,
            ranks=figures.ranks,
        )
        self._step += 1
        self._collected += 1
        self.last = stats
        self._follow_episode(stats, locate, batch)
        if self._replay is not None:  # gradscope.core.replay: the next forward is a new step
            self._replay.step_collected()
        for sink in self._sinks:
            sink.on_step(self, stats)
        return stats

    def collect(
        self,
        loss: Any = None,
        *,
        locate: Callable[[], Any] | None = None,
        batch: Any = None,
    ) -> StepStats:
        """This step's statistics. Call after ``loss.backward()`` and before
        ``optimizer.step()`` (and before any in-place clipping, to see the raw gradients).

        ``loss``: the loss tensor, or the model output carrying it (``output.loss``); it is
        recorded without a second synchronisation. ``locate``: a function that rebuilds this
        step's loss from the same batch (``lambda: criterion(model(x), y)``, with the same
        autocast and micro-batch); when this step starts a NaN/Inf episode it is re-run with
        instruments and ``stats.origin`` says the module, operation and line. It is never
        called on finite steps. ``batch``: the step's batch, checked for NaN/Inf data.
        """
        quiet = self._quiet is not None
        stats = self._quiet_step(loss, detail=self._detail_due()) if quiet else None
        if stats is None:
            stats = self.resolve(self.launch(loss, batch=batch), locate=locate, batch=batch)
        if self._replay is not None:  # gradscope.core.replay: the next forward is a new step
            self._replay.step_collected()
        return stats

    def _quiet_step(self, loss: Any, *, detail: bool) -> StepStats | None:
        """A step where nothing happens, by a short path: the same figures as
        :meth:`launch` + :meth:`resolve` give, from the same fused calls. Its cost is
        mostly the Python it runs, which a training step's forward and backward have just
        pushed out of the CPU caches, so it runs little.

        None when the step is not quiet: a gradient missing, non-finite or too small for
        its squares to be exact, a status that changes, a loss scaler, a model changed
        since the watch. Then the full path reads the step again."""
        plan = self._quiet
        scaler = self.scaler
        if (scaler is not None and scaler.is_enabled()) or type(self.model) is not self._root_class:
            return None
        if self._parameters_replaced():
            return None
        grads = [p.grad for p in plan.params]
        first = grads[0]
        if (
            first is None
            or first.dtype != plan.grad_dtype
            or first.device != plan.device
            or first.requires_grad  # backward(create_graph=True): read under no_grad
        ):
            return None
        watched = plan.watched
        weights = plan.params[:watched]
        copies = None
        try:  # a missing gradient (None) fails here, before anything is computed
            if detail:
                with torch.no_grad():  # the weights require gradients
                    pieces = self._quiet_detail(grads, weights)
                    if self.update_ratio_enabled:
                        copies = torch._foreach_mul(weights, 1.0)
            else:  # gradients that require none (checked above): no autograd to turn off
                pieces = list(torch._foreach_norm(grads, 2, dtype=plan.norm_dtype))
        except TypeError:
            return None
        if loss is not None:
            value = loss_from_output(loss).detach()
            if value.device != first.device:  # the full path reads each device on its own
                return None
            if value.dim():
                value = value.reshape(())
            pieces.append(value.real if value.is_complex() else value)
        vector = torch.stack(pieces)
        # Python's float arithmetic on a list: after a backward each numpy call costs some
        # 20 µs here (its code is out of the CPU caches), several times the arithmetic.
        listed = (vector if vector.device.type == "cpu" else _host(vector)).tolist()
        if not math.isfinite(sum(listed)):  # a NaN or an Inf
            return None
        tiny = plan.tiny
        param_norm = listed[:watched]
        if min(param_norm) < tiny and any(0 < v < tiny for v in param_norm):
            return None  # squares that underflowed: resolve reads them exactly
        grad_norm, watched_sq = self._python_norms(param_norm)
        vanish, explode = self.vanish_threshold, self.explode_threshold
        status = bytes(  # classify()'s order: exploding, then vanishing
            [
                STATUS_EXPLODING if v > explode else STATUS_VANISHING if v < vanish else STATUS_OK
                for v in grad_norm
            ]
        )
        if status != self._previous_bytes:
            return None
        unwatched_sq = 0.0
        end = watched
        for size in plan.unwatched:  # summed group by group, as resolve sums them
            unwatched_sq += _square_sum(listed[end : end + size])
            end += size
        max_abs = weight_norm = None
        if detail:
            weight_figures = listed[end : end + watched]
            end += watched
            param_max = [0.0] * watched
            for i in plan.large:
                low, high = listed[end], listed[end + 1]
                param_max[i] = high if high >= -low else -low
                end += 2
            for i in plan.small:
                param_max[i] = listed[end]
                end += 1
            if min(param_max) < tiny and any(0 < v < tiny for v in param_max):
                return None  # an imprecise norm: resolve reads it exactly
            if self._members_in_order:  # slices
                max_abs = np.array([max(param_max[span]) for span in self._python_layers])
            else:
                max_abs = np.array(
                    [max([param_max[i] for i in layer]) for layer in self._python_layers]
                )
            self._weight_norm[:] = weight_figures
            weight_norm = np.array(self._python_norms(weight_figures)[0])
        # Few numpy calls: one array for both lists of norms, one for both counts.
        layers = len(grad_norm)
        norms = np.array(grad_norm + param_norm)
        counts = np.zeros((2, layers), dtype=np.int64)
        stats = StepStats(
            step=self._step,
            loss=None if loss is None else listed[end],
            total_grad_norm=math.sqrt(watched_sq + unwatched_sq),
            grad_norm=norms[:layers],
            max_abs=max_abs,
            weight_norm=weight_norm,
            nan_count=counts[0],
            inf_count=counts[1],
            status=np.frombuffer(bytearray(status), dtype=np.uint8),  # writable, not copied
            param_grad_norm=norms[layers:],
        )
        # The weights as the optimizer found them, for update_ratio (detail steps only).
        self._weights_before = (
            None if copies is None else [(np.arange(watched), weights, copies, 0)]
        )
        self._step += 1
        self._collected += 1
        self.last = stats
        self._in_episode = False
        for sink in self._sinks:
            sink.on_step(self, stats)
        return stats

    def _quiet_detail(
        self, grads: list[torch.Tensor], weights: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """A quiet detail step's reads, as launch reads them: the L2 norms of the gradients
        and the watched weights by one fused call, then max |g| of the watched gradients,
        a (min, max) pair per large one on a CPU and one fused call for the rest."""
        plan = self._quiet
        pieces = list(torch._foreach_norm(grads + weights, 2, dtype=plan.norm_dtype))
        for i in plan.large:
            pieces += torch.aminmax(grads[i])
        if plan.small:
            pieces += torch._foreach_norm([grads[i] for i in plan.small], float("inf"))
        return pieces

    def _layer_norms(self, param_norm: np.ndarray) -> tuple[np.ndarray, float]:
        """Per-layer L2 norms from the parameters' (finite or not), and their sum of squares.
        Both paths of a step take them from here, so their figures are the same bit for
        bit: by Python's arithmetic for a model of few parameters (as the quiet path takes
        them), by numpy for a larger one."""
        if self._python_layers is not None:
            layer_norms, squares = self._python_norms(param_norm.tolist())
            return np.array(layer_norms), squares
        squares = np.square(param_norm)
        members = squares if self._members_in_order else squares[self._members]
        return np.sqrt(np.add.reduceat(members, self._offsets)), float(np.sum(squares))

    def _python_norms(self, figures: list[float]) -> tuple[list[float], float]:
        """:meth:`_layer_norms` by Python's arithmetic, on a list."""
        squares = [v * v for v in figures]
        if self._members_in_order:  # slices
            sums = [sum(squares[span]) for span in self._python_layers]
        else:
            sums = [sum([squares[i] for i in layer]) for layer in self._python_layers]
        return [math.sqrt(v) for v in sums], sum(squares)

    def _layer_max(self, param_max: np.ndarray) -> np.ndarray:
        """Per-layer max |g| from the parameters'."""
        members = param_max if self._members_in_order else param_max[self._members]
        return np.maximum.reduceat(members, self._offsets)

    def _absent_status(self, layers: np.ndarray) -> np.ndarray:
        """frozen (no parameter requires a gradient) or no gradient, for layers whose
        parameters got none this step. Read now, so an unfrozen layer is picked up."""
        sizes = self._layer_sizes[layers]
        starts = self._offsets[layers]
        # Every member of those layers, layer after layer; one flag per member.
        members = self._members[
            np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
        ]
        params = self._params
        flags = np.fromiter((params[i].requires_grad for i in members.tolist()), bool, len(members))
        trainable = np.zeros(len(layers), dtype=bool)
        nonempty = sizes > 0
        if nonempty.any():
            bounds = np.concatenate([[0], np.cumsum(sizes)[:-1]])[nonempty]
            trainable[nonempty] = np.logical_or.reduceat(flags, bounds)
        return np.where(trainable, STATUS_NO_GRADIENT, STATUS_FROZEN).astype(np.uint8)

    # -- torch.distributed ---------------------------------------------------------------
    def _name_the_rank(self, origin: Origin, ranks: RankFacts) -> None:
        """Which rank's batch or loss started the episode: in the origin of every rank."""
        assert self._exchange is not None
        broken = ranks.broken
        origin.details["rank"] = self._exchange.rank
        origin.details["ranks"] = ranks.to_dict()
        if not broken or self._exchange.rank in broken:
            return
        if origin.phase == "unknown":
            names = ", ".join(map(str, broken))
            origin.details["reason"] = (
                f"this rank's batch and loss were finite; rank {names} had a non-finite batch "
                "or loss at this step, and its NaN/Inf reached this rank through the gradient "
                f"all-reduce: see rank {broken[0]}'s origin"
            )

    @staticmethod
    def _shard_parts(
        group: _Group,
    ) -> tuple[list[int] | None, list[torch.Tensor], list[torch.Tensor]]:
        """A sharded group's parameters that got a gradient this step (positions, None for
        all), and this rank's parts of their gradients and weights. Decided the same way on
        every rank (their vectors must line up in the exchange): FSDP1 asks the parameter's
        unit, and a rank whose shard holds none of a parameter's elements reads it as empty."""
        params = group.params
        if group.flat is None:
            grads = [p.grad for p in params]
            present = None
            if any(g is None for g in grads):
                present = [i for i, g in enumerate(grads) if g is not None]
                grads = [grads[i] for i in present]
                params = [params[i] for i in present]
            return present, [local(g) for g in grads], [local(p) for p in params]
        units: dict[int, bool] = {}
        chosen = []
        for i, (p, spec) in enumerate(zip(params, group.flat, strict=True)):
            key = id(spec.handle)
            if key not in units:
                units[key] = spec.has_gradient(p)
            if units[key] and p.requires_grad:
                chosen.append(i)
        present = None if len(chosen) == len(params) else chosen
        params = [params[i] for i in chosen]
        grads = [p.grad if p.grad is not None else p.detach().reshape(-1)[:0] for p in params]
        return present, grads, [p.detach() for p in params]

    @staticmethod
    def _launch_sharded(
        group: _Group,
        grads: list[torch.Tensor],
        params: list[torch.Tensor],
        detail: bool,
        shared: list[torch.Tensor],
        kinds: list[int],
        *,
        reduce: bool = True,
    ) -> int:
        """This rank's figures of a sharded group (its parts of each gradient and weight),
        in the layout resolve reads: each gradient's sum of squares, then on detail steps
        each weight's sum of squares and each gradient's max |g| (0 for an empty part).
        Sums are divided by the replicas so that the sum over ranks counts each shard once.
        ``reduce=False``: the gradients are this rank's own whole ones (FSDP1 no_sync), kept
        as they are. Fused calls: a few kernels per group, not per parameter. Returns the
        count."""
        count = len(grads)
        grad_kind = SUM if reduce else KEEP
        shared.append(_squares(grads) / group.replicas if reduce else _squares(grads))
        kinds += (grad_kind,) * count
        if not detail:
            return count
        shared.append(_squares(params) / group.replicas)
        nonempty = [_values(g) for g in grads if g.numel()]
        if not nonempty:
            found = iter(())
        elif nonempty[0].device.type in _PER_TENSOR_DEVICES:
            # On a CPU one aminmax per tensor is about 13x faster than _foreach_norm's ord
            # inf (measured on 40 local shards, one thread): max |g| = max(max, -min).
            pairs = [torch.aminmax(v) for v in nonempty]
            lows = torch.stack([pair[0] for pair in pairs])
            highs = torch.stack([pair[1] for pair in pairs])
            found = iter(torch.maximum(highs, -lows).unbind())
        else:
            found = iter(torch._foreach_norm(nonempty, float("inf")))
        zero = grads[0].new_zeros((), dtype=nonempty[0].dtype if nonempty else torch.float32)
        # No index tensor (a host-to-device copy): the empty parts' zeros stacked in place.
        shared.append(torch.stack([next(found) if g.numel() else zero for g in grads]).double())
        kinds += (SUM,) * count + (MAX if reduce else KEEP,) * count
        return count

    def _gradients_unreduced(self) -> bool:
        """Whether FSDP1 units hold whole, unreduced gradients (a backward inside
        ``no_sync()``: gradient accumulation): the same answer on every rank, from the
        units' flat gradients, whose size is then the unit's, not the shard's. Warned once."""
        groups = [g for g in (*self._groups, *self._unwatched_groups) if g.flat is not None]
        if not groups or self._exchange is None:
            return False
        handles = {id(spec.handle): spec.handle for g in groups for spec in g.flat}
        unreduced = False
        for handle in handles.values():
            if handle is None:
                continue
            flat = handle.flat_param
            grad = flat.grad
            if grad is not None and grad.numel() != flat.numel():
                unreduced = True
                break
        if unreduced and not self._warned_unreduced:
            self._warned_unreduced = True
            warn_user(
                "gradscope.watch: collect() ran inside FSDP's no_sync() (gradient "
                "accumulation): each rank's gradients are its own and not yet reduced, so "
                "this step's gradient figures are this rank's. Call collect() after the "
                "backward that runs outside no_sync() for the model's"
            )
        return unreduced

    def _facts(self, loss: torch.Tensor | None, batch: Any) -> list[torch.Tensor]:
        """This rank's facts for the step's exchange: loss, loss given, batch non-finite."""
        device = loss.device if loss is not None else self._fact_device()
        if loss is not None:
            value = loss.detach().reshape(()).float()
            given = torch.ones((), device=device)
        else:
            value = torch.full((), float("nan"), device=device)
            given = torch.zeros((), device=device)
        tensors = [t for t in float_tensors(batch) if t.numel()] if batch is not None else []
        if tensors:
            bad = torch.stack([~torch.isfinite(t).all() for t in tensors]).any().float()
            bad = bad.to(device)
        else:
            bad = torch.zeros((), device=device)
        return [value, given, bad]

    def _fact_device(self) -> torch.device:
        if self._exchange is not None and self._exchange.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _kinds_tensor(self, kinds: tuple[int, ...], device: torch.device) -> torch.Tensor:
        cached = getattr(self, "_kinds_cache", None)
        if cached is None or cached[0] != (kinds, device):
            cached = ((kinds, device), torch.tensor(kinds, dtype=torch.int8, device=device))
            self._kinds_cache = cached
        return cached[1]

    # -- loss scaling --------------------------------------------------------------------
    def _scale_tensor(self) -> torch.Tensor | None:
        """The scaler's current scale as a device tensor (read with the step's one transfer),
        or None without an enabled scaler that has scaled a loss yet."""
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled():
            return None
        return getattr(scaler, "_scale", None)

    def _scale_divisors(self, scale: float) -> tuple[np.ndarray, float]:
        """What each parameter's gradient figures are divided by: the scale, or 1 for the
        parameters of an optimizer whose gradients ``scaler.unscale_`` already divided."""
        states = getattr(self.scaler, "_per_optimizer_states", {})

        def unscaled(optimizer_id: int) -> bool:
            stage = states.get(optimizer_id, {}).get("stage")
            return getattr(stage, "name", "") == "UNSCALED"

        if not self.optimizers:  # unknown owners: the common case of one optimizer
            value = 1.0 if any(unscaled(key) for key in list(states)) else scale
            return np.full(len(self._params), value), value
        divisor = np.full(len(self._params), scale)
        index = {id(p): i for i, p in enumerate(self._params)}
        all_done = True
        for optimizer in self.optimizers:
            if not unscaled(id(optimizer)):
                all_done = False
                continue
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) in index:
                        divisor[index[id(p)]] = 1.0
        return divisor, 1.0 if all_done else scale

    # -- NaN/Inf episodes ---------------------------------------------------------------
    def _follow_episode(
        self, stats: StepStats, locate: Callable[[], Any] | None, batch: Any
    ) -> None:
        """A NaN/Inf episode starts at a non-finite step after a finite one; its first step
        gets an origin (located by a re-run when ``locate`` is given)."""
        if not stats.nonfinite:
            self._in_episode = False
            return
        if self._in_episode:
            return
        self._in_episode = True
        repeat = locate is None and self._replay is not None  # gradscope.core.replay
        if locate is None and not repeat:
            origin = statistics_origin(stats, [layer.name for layer in self.layers])
            if self._sharded:
                origin.details["hint"] = (
                    "found from the statistics alone; a sharded model's step is not re-run "
                    "(its forward gathers parameters from every rank): to find the operation "
                    "and line, run the model unsharded in one process on this step's batch "
                    "with locate="
                )
        elif self._located >= self.max_located:
            origin = statistics_origin(stats, [layer.name for layer in self.layers])
            origin.details["reason"] = (
                f"not re-run: {self.max_located} NaN/Inf episodes were already located "
                "(max_located)"
            )
        else:
            self._located += 1
            origin = (
                self._replay.locate(  # gradscope.core.replay: repeat the captured step
                    self.wrapped_model,
                    stats,
                    [layer.name for layer in self.layers],
                    batch=batch,
                    timeout=self.locate_timeout,
                )
                if repeat
                else locate_safely(
                    self.wrapped_model,
                    locate,
                    stats,
                    [layer.name for layer in self.layers],
                    batch=batch,
                    timeout=self.locate_timeout,
                )
            )
        if stats.ranks is not None:
            self._name_the_rank(origin, stats.ranks)
        if stats.scale_collapsed:
            origin.details["scale_collapse"] = stats.loss_scale
            collapse = (
                f"the loss scale collapsed to {stats.loss_scale:g}: the scaled gradients "
                "overflow at every scale, so the scaler skips every step"
            )
            if origin.phase == "unknown" and "finite" in origin.details.get("reason", ""):
                origin.details["reason"] = (
                    f"{collapse}; the unscaled re-run was finite, so the overflow is in the "
                    "half-precision backward itself: look for activations or gradients beyond "
                    "65504 (normalise or clamp them, or run that layer in float32)"
                )
            else:
                origin.details.setdefault("reason", collapse)
        if origin.phase == "update" and self._collected == 1:
            # Non-finite weights at the first step this watch saw: no optimizer step of its
            # wrote them; they came that way (never initialised, or loaded so).
            origin.details["at_start"] = True
            origin.op = "initialisation"
            from gradscope.core.diagnosis import hint_for

            origin.details["hint"] = hint_for(origin)
        elif origin.phase == "update":
            # The weights were written by the last applied optimizer step.
            origin.step = stats.step - 1
            names = sorted({type(each).__name__ for each in self.optimizers})
            origin.op = f"{'/'.join(names) or 'optimizer'}.step"
            from gradscope.core.diagnosis import hint_for

            origin.details["hint"] = hint_for(origin)
        stats.origin = origin
        self.origins.append(origin)

    # -- exact figures on rare steps ----------------------------------------------------
    def _count_nonfinite(
        self,
        suspects: np.ndarray,
        param_norm: np.ndarray,
        nan_out: np.ndarray,
        inf_out: np.ndarray,
    ) -> None:
        # Only on steps where something is already wrong: count NaN and Inf separately, and
        # tell a real Inf element from a sum of squares that overflowed.
        grads = [self._local_grad(index) for index in suspects]
        by_device: dict[torch.device, list[int]] = {}
        for k, grad in enumerate(grads):
            by_device.setdefault(grad.device, []).append(k)
        counts: list[Any] = [None] * len(grads)
        for positions in by_device.values():  # one read per device
            values = [_values(grads[k]) for k in positions]
            pairs = torch.stack([torch.stack([v.isnan().sum(), v.isinf().sum()]) for v in values])
            sharded = [i for i, k in enumerate(positions) if self._replicas[suspects[k]]]
            if sharded and self._exchange is not None and not self._unreduced:
                # Shards' counts summed over the ranks (every rank has the same sharded
                # suspects: their figures were reduced), each shard once; other parameters'
                # are this rank's.
                copies = torch.tensor(
                    [int(self._replicas[suspects[positions[i]]]) for i in sharded],
                    device=pairs.device,
                )
                summed = self._exchange_sum(pairs[sharded].contiguous())
                pairs[sharded] = torch.div(summed, copies[:, None], rounding_mode="floor")
            for k, pair in zip(positions, _host(pairs), strict=True):
                counts[k] = pair
        finite = []
        for index, (nans, infs) in zip(suspects, counts, strict=True):
            nan_out[index], inf_out[index] = int(nans), int(infs)
            if nans == 0 and infs == 0:
                finite.append(index)
        if finite:
            param_norm[finite] = self._exact_norms(np.asarray(finite, dtype=np.intp))

    def _local_grad(self, index: int) -> torch.Tensor:
        """This rank's part of a watched parameter's gradient (empty where an FSDP1 rank holds
        none of it)."""
        param = self._params[index]
        grad = param.grad
        if grad is None:
            return param.detach().reshape(-1)[:0]
        return local(grad)

    def _exact_norms(self, indices: np.ndarray) -> np.ndarray:
        """:func:`_exact_norm` of several watched parameters' gradients with one host read per
        device: each is scaled by its own max |g| so that no square overflows or underflows.
        Shards: float64 sums of squares (float32 values neither overflow nor underflow
        there), summed over the ranks, each shard once."""
        indices = np.asarray(indices, dtype=np.intp)
        grads = [self._local_grad(i) for i in indices.tolist()]
        out = np.zeros(len(grads))
        copies = self._replicas[indices]
        sharded = np.flatnonzero(copies)
        if len(sharded) and self._exchange is not None and not self._unreduced:
            squares = torch.stack([_values(grads[k]).double().square().sum() for k in sharded])
            summed = self._exchange_sum(squares)
            out[sharded] = np.sqrt(_host(summed) / copies[sharded])
            grads = [g if not copies[k] else None for k, g in enumerate(grads)]
        by_device: dict[torch.device, list[int]] = {}
        for k, grad in enumerate(grads):
            if grad is not None:
                by_device.setdefault(grad.device, []).append(k)
        for positions in by_device.values():
            figures = []
            for k in positions:
                values = _values(grads[k].detach()).double().reshape(-1)
                if not values.numel():
                    figures.append(values.new_zeros(2))
                    continue
                scale = values.abs().max()
                safe = torch.where(scale > 0, scale, torch.ones_like(scale))
                figures.append(torch.stack([scale, torch.linalg.vector_norm(values / safe)]))
            pairs = _host(torch.stack(figures))
            with np.errstate(invalid="ignore"):
                out[positions] = pairs[:, 0] * pairs[:, 1]
        return out

    def _unwatched_squares(self, bad: list[tuple[_Group, list[int]]]) -> float:
        """The exact sum of squares of unwatched gradients whose fast figures were not finite
        (NaN if any element really is): one host read per group, and for a sharded group one
        sum over the ranks (every rank gets here at the same step: its figures were reduced)."""
        total = 0.0
        for group, present in bad:
            grads = []
            for i in present:
                grad = group.params[i].grad
                if grad is None:  # an FSDP1 rank that holds none of this parameter
                    grad = group.params[i].detach().reshape(-1)[:0]
                grads.append(_values(local(grad)).double())
            figures = torch.stack(
                [
                    torch.stack([(~torch.isfinite(g)).sum().double(), g.square().sum()])
                    for g in grads
                ]
            ).sum(dim=0)
            if group.sharded and self._exchange is not None and not self._unreduced:
                figures = self._exchange_sum(figures)
                figures[1] /= group.replicas
            bad_elements, squares = _host(figures).tolist()
            if bad_elements:
                return float("nan")
            total += squares
        return total

    @torch.no_grad()
    def measure_update(self) -> np.ndarray | None:
        """After ``optimizer.step()``: ||Δw||/||w|| per layer for the last collected step.
        Under sharding (FSDP) the sums of this rank's parts are reduced with the next
        step's exchange instead, so it returns None and ``update_ratio`` of that step's
        stats is filled in by the next :meth:`collect` (before the sinks see that step)."""
        if self._weights_before is None or self.last is None:
            return None
        delta = np.zeros(len(self._params))
        pending = []
        shard_parts = []
        for indices, now, before, copies in self._weights_before:
            diffs = torch._foreach_sub(now, before)
            if copies and self._exchange is not None:
                shard_parts.append((indices, _squares(diffs), copies))
                continue
            norms = torch._foreach_norm(diffs, 2, dtype=_norm_dtype(now[0]))
            pending.append((indices, torch.stack(norms)))
        for indices, norms in pending:
            delta[indices] = _host(norms.double())
        self._weights_before = None
        if shard_parts:
            self._update_pending = _PendingUpdate(self.last, delta, shard_parts)
            return None
        return self._set_update_ratio(self.last, delta)

    def _set_update_ratio(self, stats: StepStats, delta: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            layer_delta = np.sqrt(np.add.reduceat(np.square(delta[self._members]), self._offsets))
            weight = stats.weight_norm
            ratio = np.where(
                weight > 0, layer_delta / weight, np.where(layer_delta > 0, np.inf, 0.0)
            )
        stats.update_ratio = ratio
        return ratio

    def _send_update(
        self, shared: list[torch.Tensor], kinds: list[int], layout: list[_Entry]
    ) -> None:
        """Queue the last update's sharded sums (zeros where this rank's optimizer did not
        step) and a count of the ranks that stepped into this step's exchange."""
        count, pending = self._update_slots, self._update_pending
        device = self._fact_device()
        if pending is not None:
            sums = [squares / copies for _, squares, copies in pending.parts]
            shared.append(torch.cat([*sums, torch.ones(1, dtype=torch.float64, device=device)]))
        else:
            shared.append(torch.zeros(count + 1, dtype=torch.float64, device=device))
        kinds += (SUM,) * (count + 1)
        layout.append(_Entry("update", count=count))
        self._update_slots = 0

    def _receive_update(self, values: np.ndarray) -> None:
        """The last update's sums over the ranks: its stats' update ratio, when every rank
        stepped (otherwise the ranks' weights parted ways, and no ratio is made up)."""
        pending, self._update_pending = self._update_pending, None
        if pending is None or self._exchange is None or values[-1] < self._exchange.world:
            return
        delta, cursor = pending.delta, 0
        for indices, squares, _ in pending.parts:
            delta[indices] = np.sqrt(values[cursor : cursor + len(squares)])
            cursor += len(squares)
        self._set_update_ratio(pending.stats, delta)

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close the sinks (a recording's last steps) and remove every hook this
        watch added (the statistics themselves need none)."""
        try:
            for sink in self._sinks:
                sink.close()
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            if self._replay is not None:  # gradscope.core.replay
                self._replay.close()

    def __enter__(self) -> GradientWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
