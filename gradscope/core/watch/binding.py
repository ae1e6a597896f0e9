"""Which parameters a watch reads, and how: the watched layers and their parameters, and the
groups (device, dtype, size class, sharding) that each take one batch of reads per step.

Made when the watch is made, and again when the model's parameters are replaced after it
(``fully_shard`` turns them into DTensors and changes the module's class; a model built on the
meta device gets real ones from ``to_empty``; FSDP1 makes them views)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from gradscope.core.facts import LayerInfo
from gradscope.core.module_tree import select_layers
from gradscope.core.sharded import FlatShard, flat_shards, flattened_by_fsdp, full_numel
from gradscope.core.sharded import is_sharded as is_sharded_tensor
from gradscope.core.sharded import replicas as replicas_of
from gradscope.core.user_warnings import warn_user
from gradscope.core.wrappers import named_layers, named_parameters

# Up to this many elements a tensor is "small": its figures are read by stacking the group's
# tensors (all of one shape) into one batch, which costs far less per tensor than a fused
# ``_foreach_norm`` on a CPU (measured: 6,000 tensors of 16 to 256 elements, 6 ms against
# 36 ms) and sums their squares in float64, where no float32 square underflows or overflows.
SMALL_NUMEL = 4096
# At most this many elements are stacked in one batch (bounds the float64 copy's memory).
STACK_ELEMENTS = 1 << 22
# A shape shared by fewer small tensors than this is read with its device's other tensors by
# the fused call (a stacked batch's few ops cost more than that call's per-tensor cost for
# a handful); a norm that may have lost squares is then read again exactly.
STACK_MIN = 32


@dataclass
class ParameterGroup:
    """Parameters sharing a device and dtype when the watch was made, and a size class: one
    batch of calls each. (Moving the model afterwards is fine: devices and dtypes are read
    again from the gradients at every step.) The lists are built once; only ``.grad`` is
    read per step."""

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
    # Real, non-empty tensors of at most SMALL_NUMEL elements, all of one shape: read by
    # stacking (see gradscope.core.watch.reads).
    stacked: bool = False
    # The reads' layout entries of this group, made once per kind of step (plain or detail,
    # which parameters have a gradient): see gradscope.core.watch.reads.
    entries: dict[Any, Any] = field(default_factory=dict)

    # Each parameter's number of elements (a gradient's, but for sparse ones).
    sizes: tuple[int, ...] = ()

    def freeze(self) -> ParameterGroup:
        self.index_array = np.asarray(self.indices, dtype=np.intp)
        self.sizes = tuple(p.numel() for p in self.params)
        self.empty = frozenset(i for i, n in enumerate(self.sizes) if n == 0)
        return self


def group_parameters(
    params: Sequence[torch.Tensor],
    sparse_capable: set[int],
    flat: Mapping[int, FlatShard],
) -> list[ParameterGroup]:
    groups: dict[tuple[Any, ...], ParameterGroup] = {}
    for index, p in enumerate(params):
        sparse = id(p) in sparse_capable
        spec = flat.get(id(p))
        if spec is not None:
            copies = spec.replicas
        else:
            copies = replicas_of(p) if is_sharded_tensor(p) else 0  # 0: not sharded
        stacked = (
            copies == 0
            and not sparse
            and 0 < p.numel() <= SMALL_NUMEL
            and not p.is_complex()
            and p.device.type != "meta"
        )
        shape = tuple(p.shape) if stacked else None
        key = (p.device, p.dtype, sparse, copies, stacked, shape, spec is not None)
        if key not in groups:
            groups[key] = ParameterGroup(
                [],
                [],
                sparse_capable=sparse,
                sharded=copies > 0,
                replicas=max(1, copies),
                stacked=stacked,
                flat=[] if spec is not None else None,
            )
        groups[key].indices.append(index)
        groups[key].params.append(p)
        if spec is not None:
            groups[key].flat.append(spec)
    found = []
    for key, group in list(groups.items()):
        if group.stacked and len(group.params) < STACK_MIN:
            # Too few of this shape: read with the fused call, as a large group's members.
            del groups[key]
            plain = (key[0], key[1], False, 0, False, None, False)
            if plain not in groups:
                groups[plain] = ParameterGroup([], [])
            groups[plain].indices.extend(group.indices)
            groups[plain].params.extend(group.params)
    for group in groups.values():
        if group.stacked and len(group.params) > 1:
            # Split so that no batch stacks more than STACK_ELEMENTS elements.
            per_batch = max(1, STACK_ELEMENTS // group.params[0].numel())
            for start in range(0, len(group.params), per_batch):
                found.append(
                    ParameterGroup(
                        group.indices[start : start + per_batch],
                        group.params[start : start + per_batch],
                        stacked=True,
                    ).freeze()
                )
            continue
        found.append(group.freeze())
    return found


@dataclass
class Binding:
    """The watched layers, their parameters and the groups they are read in."""

    root_class: type
    # The model's first parameter (its owner, name, tensor, device, whether FSDP1 flattened
    # it) tells at each step whether the parameters were replaced, moved or taken into FSDP1
    # units since: one look, not one per parameter.
    probe: tuple[Any, ...]
    layers: list[LayerInfo]
    params: list[torch.Tensor]
    param_names: list[str]
    # Each layer's parameters (indices into ``params``), layer after layer, and where each
    # layer's run starts.
    members: np.ndarray
    offsets: np.ndarray
    layer_sizes: np.ndarray
    # Each watched parameter in exactly one layer, in order: per-layer sums need no gather.
    members_in_order: bool
    groups: list[ParameterGroup]
    unwatched_groups: list[ParameterGroup]
    # Any group sharded; sharded and whole parameters in one model (say, a module left out
    # of FSDP): the whole ones' figures are this rank's own, so a status decided from them
    # may differ between ranks, and a second read must not run a collective.
    sharded: bool
    mixed_sharding: bool
    # Per watched parameter, the ranks holding its shard (0: not sharded).
    replicas: np.ndarray
    # Whether a watched layer covers no parameter at all (it is then frozen).
    has_empty_layers: bool
    # Whether some watched parameter is float64 (its figures' squares can overflow).
    wide: bool = False
    # The common step's plans, by the layout of a step's vector (see
    # gradscope.core.watch.plain_step): kept with the binding, so a rebind starts afresh.
    plain_plans: dict[Any, Any] = field(default_factory=dict)

    def parameters_replaced(self, model: nn.Module) -> bool:
        """Whether the model's parameters changed since it was bound (see the module)."""
        if type(model) is not self.root_class:
            return True
        owner, key, probe, device, flattened = self.probe
        if owner is None:
            return next(model.parameters(), None) is not None
        first = owner._parameters.get(key)
        if first is not probe:
            return True
        return first.device != device or (not flattened and flattened_by_fsdp(first))


def _probe(model: nn.Module) -> tuple[Any, ...]:
    # Its owner and name too: a look in one dict, not a walk of the modules.
    owner = key = probe = None
    for module in model.modules():
        key = next((k for k, v in module._parameters.items() if v is not None), None)
        if key is not None:
            owner, probe = module, module._parameters[key]
            break
    return (
        owner,
        key,
        probe,
        None if probe is None else probe.device,
        probe is not None and flattened_by_fsdp(probe),
    )


def bind(model: nn.Module, layers_spec: list[str] | None, *, exchanged: bool) -> Binding:
    """Find the watched layers and their parameters, and group them for the per-step reads.
    ``exchanged``: figures are exchanged with the other ranks (otherwise each shard of this
    rank counts once, as it is)."""
    flat, unit_unknown = flat_shards(model)
    probe = _probe(model)
    if unit_unknown:
        warn_user(
            "gradscope.watch: the watch was made on the model before FSDP wrapped it whole, "
            "and that wrapper is out of its reach: its parameters are read as a FULL_SHARD "
            "unit's, with this rank's parameter counts. Make the watch on the FSDP-wrapped "
            "model for exact sizes and HYBRID_SHARD"
        )
    if any(
        spec.handle is not None and spec.handle.flat_param._params is None for spec in flat.values()
    ):
        warn_user(
            "gradscope.watch: FSDP wrapped without use_orig_params=True, so each FSDP unit "
            "holds one flat parameter and GradScope's layers are those units; wrap with "
            "use_orig_params=True for per-layer statistics"
        )
    names = select_layers(model, layers_spec)
    modules = named_layers(model)
    qualified = named_parameters(model)
    sparse_capable = {
        id(p)
        for m in model.modules()
        if getattr(m, "sparse", False) is True
        for p in m.parameters(recurse=False)
    }
    layers: list[LayerInfo] = []
    params: list[torch.Tensor] = []
    param_names: list[str] = []
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
                index_of[id(p)] = len(params)
                params.append(p)
                param_names.append(qualified[id(p)])
                owner[id(p)] = name
            elif owner[id(p)] != name:
                tied.append(qualified[id(p)])
            members.append(index_of[id(p)])
        layers.append(
            LayerInfo(
                name=name,
                type_name=type(module).__name__,
                param_names=tuple(qualified[id(p)] for p in covered),
                num_params=sum(full_numel(p) for p in covered if qualified[id(p)] not in tied),
                tied=tuple(tied),
            )
        )
    member_array = np.asarray(members, dtype=np.intp)
    offset_array = np.asarray(offsets, dtype=np.intp)
    layer_sizes = np.diff(np.append(offset_array, len(members)))
    # Unwatched parameters still count towards the total norm when they have gradients,
    # so a NaN anywhere in the model is noticed even when only a few layers are watched.
    unwatched = [p for p in model.parameters() if id(p) not in index_of]
    groups = group_parameters(params, sparse_capable, flat)
    unwatched_groups = group_parameters(unwatched, sparse_capable, flat)
    every = (*groups, *unwatched_groups)
    if not exchanged:  # this rank's shards only: each counts once, as it is
        for group in every:
            group.replicas = 1
    sharded = any(g.sharded for g in every)
    replicas = np.zeros(len(params), dtype=np.int64)  # 0: not sharded
    for group in groups:
        if group.sharded:
            replicas[group.index_array] = group.replicas
    return Binding(
        root_class=type(model),
        probe=probe,
        layers=layers,
        params=params,
        param_names=param_names,
        members=member_array,
        offsets=offset_array,
        layer_sizes=layer_sizes,
        members_in_order=bool(np.array_equal(member_array, np.arange(len(params)))),
        groups=groups,
        unwatched_groups=unwatched_groups,
        sharded=sharded,
        mixed_sharding=sharded and not all(g.sharded for g in every),
        replicas=replicas,
        has_empty_layers=bool((layer_sizes == 0).any()),
        wide=any(p.dtype in (torch.float64, torch.complex128) for p in params),
    )
