"""Whole-model statistics under torch.distributed, with the fewest collectives.

Under DDP every rank holds the whole, already all-reduced gradient: its statistics need no
collective. Under FSDP2 (``torch.distributed.fsdp.fully_shard``) parameters and gradients
are DTensors and each rank holds a shard: the whole tensor's sum of squares is the sum of
the shards', its max |g| the maximum of theirs. Under FSDP1 (``FullyShardedDataParallel``)
with ``use_orig_params=True`` each parameter is a flat view of the elements this rank's
shard of its unit holds (none at all on some ranks, whose gradient is then None): the same
sums and maxima apply (:class:`FlatShard`). Without ``use_orig_params`` the unit's
FlatParameter is the only parameter, and is read the same way.

Gathering whole tensors (``full_tensor()``) would move the model across the network at every
step; instead each rank packs its local figures into one small vector and one
``all_gather`` per step brings every rank's vector, which each rank reduces locally (a sum
for sums of squares, a maximum for max |g|).

The same gather carries the per-rank facts: each rank's loss and whether its own batch or
loss went non-finite, so every rank knows which rank broke first (under DDP, a NaN in one
rank's batch reaches every rank's gradients through the all-reduce). Without torch.distributed,
or with one process, nothing here runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from gradscope.core.user_warnings import warn_user

# Slot kinds in the exchanged vector.
SUM, MAX, KEEP = 0, 1, 2
FACT_SLOTS = 3  # per rank: loss, loss given (0/1), batch non-finite (0/1)


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed
        return None
    return DTensor


_DTENSOR = _dtensor_type()


def is_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor (FSDP2 parameter or gradient): each rank holds a part."""
    return _DTENSOR is not None and isinstance(tensor, _DTENSOR)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor; any other tensor as it is."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def replicas(tensor: torch.Tensor) -> int:
    """How many ranks hold the same part of a DTensor (its replicated mesh dimensions, as
    in HSDP): a sum over every rank counts each part that many times."""
    if not is_sharded(tensor):
        return 1
    from torch.distributed.tensor import Replicate

    count = 1
    for dim, placement in enumerate(tensor.placements):
        if isinstance(placement, Replicate):
            count *= tensor.device_mesh.size(dim)
    return count


def full_numel(tensor: torch.Tensor) -> int:
    """The whole parameter's number of elements, on any rank (a DTensor's is global; an
    FSDP1 view's is only this rank's part: its unit knows the whole)."""
    spec = getattr(tensor, "_gradscope_flat_shard", None)
    return spec.numel if spec is not None else tensor.numel()


@dataclass(frozen=True)
class FlatShard:
    """An FSDP1 parameter on this rank: some of its elements (a flat view into the shard of
    its unit's FlatParameter), or none. ``handle``: the unit's FlatParamHandle (None when
    out of reach, see :func:`flat_shards`); ``numel``: the whole parameter's elements;
    ``replicas``: ranks holding the same shard (HSDP)."""

    handle: Any
    numel: int
    replicas: int

    def has_gradient(self, param: torch.Tensor) -> bool:
        """Whether the parameter got a gradient this step, the same on every rank: the unit
        has one (a rank whose shard holds none of the parameter's elements sees None)."""
        if not param.requires_grad or self.handle is None:
            return param.requires_grad
        try:
            return self.handle.sharded_grad is not None
        except Exception:  # a training state where FSDP refuses to say: its own field
            return self.handle.flat_param.grad is not None


def flat_shards(model: torch.nn.Module) -> tuple[dict[int, FlatShard], bool]:
    """The FSDP1-sharded parameters of ``model``, by ``id`` (none without FSDP1 or with its
    NO_SHARD strategy: whole, all-reduced gradients, as under DDP), and whether some
    parameter was taken into a unit the model does not lead to (a watch made on the model
    before ``FullyShardedDataParallel(model)`` wrapped it, with no unit inside it). Each is
    also marked (``_gradscope_flat_shard``) for :func:`full_numel`."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return {}, False
    handles: dict[int, Any] = {}
    for module in model.modules():
        if not isinstance(module, FullyShardedDataParallel):
            continue
        found = [getattr(module, "_handle", None)]
        # A model wrapped by FSDP after watch() was made on it does not hold the root unit
        # (the wrapper holds the model): every unit knows all handles after a forward.
        found += getattr(getattr(module, "_exec_order_data", None), "all_handles", [])
        handles.update((id(handle), handle) for handle in found if handle is not None)
    out: dict[int, FlatShard] = {}
    known: set[int] = set()
    for handle in handles.values():
        known.update(map(id, handle.flat_param._params or [handle.flat_param]))
        if not handle.uses_sharded_strategy:
            continue
        flat = handle.flat_param
        world = torch.distributed.get_world_size()
        replicas = max(1, world // torch.distributed.get_world_size(handle.process_group))
        if flat._params is None:  # use_orig_params=False: the unit is one parameter
            pairs = [(flat, int(flat._unpadded_unsharded_size.numel()))]
        else:
            pairs = list(zip(flat._params, (int(n) for n in flat._numels), strict=True))
        for param, numel in pairs:
            spec = FlatShard(handle, numel, replicas)
            param._gradscope_flat_shard = spec
            out[id(param)] = spec
    # Parameters of a unit the model does not lead to: read as a plain (FULL_SHARD) unit's,
    # each rank's part summed; whether they got a gradient is their requires_grad.
    unknown = False
    for param in model.parameters():
        if flattened_by_fsdp(param) and id(param) not in known:
            unknown = True
            out[id(param)] = FlatShard(None, param.numel(), 1)
    return out, unknown


def flattened_by_fsdp(param: torch.Tensor) -> bool:
    """Whether FSDP1 has taken the parameter into a unit (its data became a flat view)."""
    # FSDP sets it with setattr: a look in the tensor's __dict__, without getattr's
    # AttributeError on every other tensor (this runs at every step)
    return bool(vars(param).get("_fsdp_flattened", False))


JOIN_SECONDS = 30.0
_watches_made = 0


def _all_ranks_join(timeout: float) -> bool:
    """Whether every rank makes this (n-th) watch, found through the process group's
    key-value store, not a collective: a watch made on one rank only (a common logging
    pattern) must not wait in a collective the others never join. Ranks make their watches
    in the same order, so the n-th watch of each rank meets at the same key."""
    global _watches_made
    _watches_made += 1
    try:
        store = torch.distributed.distributed_c10d._get_default_store()
    except Exception:  # no store to ask: trust that every rank makes it
        return True
    key = f"gradscope/watch/{_watches_made}"
    world = torch.distributed.get_world_size()
    deadline = time.monotonic() + timeout
    arrived = store.add(key, 1)
    while arrived < world and time.monotonic() < deadline:
        time.sleep(0.01)
        arrived = store.add(key, 0)
    # One verdict for every rank: the first to decide sets it (a rank that gave up before a
    # late one arrived makes that one give up too, rather than wait in a collective alone).
    verdict = "joined" if arrived >= world else "alone"
    return store.compare_set(f"{key}/verdict", "", verdict) == b"joined"


class RankExchange:
    """One ``all_gather`` per step of a small vector of local figures, reduced locally."""

    def __init__(self) -> None:
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()
        self.backend = torch.distributed.get_backend()

    @staticmethod
    def current(*, verify: bool = True, timeout: float = JOIN_SECONDS) -> RankExchange | None:
        """The exchange of this process's default group, or None outside torch.distributed,
        with one process, or when the other ranks make no watch (see :func:`_all_ranks_join`)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return None
        if torch.distributed.get_world_size() < 2:
            return None
        if verify and not _all_ranks_join(timeout):
            warn_user(
                "gradscope.watch: the other ranks made no watch (a watch on one rank only, "
                "e.g. under `if rank == 0`): no collective is run, so the per-rank facts are "
                "off and sharded (FSDP) statistics cover this rank's shards only. Make the "
                "watch on every rank for whole-model statistics, or pass collectives=False "
                "to say it is made on one rank"
            )
            return None
        return RankExchange()

    def exchange(self, vector: torch.Tensor, kinds: torch.Tensor, facts: int) -> torch.Tensor:
        """Every rank's ``vector`` gathered (one collective), then reduced by slot kind
        (``kinds``, one per slot but the last ``facts``): SUM and MAX slots become the sum
        and the maximum over ranks, KEEP slots keep this rank's value. The last ``facts``
        slots (this rank's facts) are replaced by every rank's, in rank order. Returns the
        reduced vector, on the same device, with no host synchronisation."""
        length = vector.numel()
        flat = torch.empty(self.world * length, dtype=vector.dtype, device=vector.device)
        # all_gather_single replaces the deprecated all_gather_into_tensor (torch >= 2.14).
        gather = getattr(torch.distributed, "all_gather_single", None)
        (gather or torch.distributed.all_gather_into_tensor)(flat, vector)
        gathered = flat.view(self.world, length)
        body = length - facts
        mine = vector[:body]
        reduced = torch.where(
            kinds == SUM,
            gathered[:, :body].sum(dim=0),
            torch.where(kinds == MAX, gathered[:, :body].amax(dim=0), mine),
        )
        if not facts:
            return reduced
        return torch.cat([reduced, gathered[:, body:].reshape(-1)])

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """A sum over ranks, for the rare steps that need exact figures (NaN/Inf counts,
        norms of tiny gradients)."""
        torch.distributed.all_reduce(tensor)
        return tensor
