"""The watch under torch.distributed: this rank's parts of sharded groups, read in the layout
the step's one exchange reduces (see gradscope.core.sharded), and the per-rank facts that
travel with it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import gradscope.core.watch.figures as tensor_reads
from gradscope.core.facts import Origin, RankFacts
from gradscope.core.origin import float_tensors
from gradscope.core.sharded import KEEP, MAX, SUM, local
from gradscope.core.user_warnings import warn_user
from gradscope.core.watch.binding import ParameterGroup
from gradscope.core.watch.figures import squares_of, values_of


def shard_parts(
    group: ParameterGroup,
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


def queue_sharded(
    group: ParameterGroup,
    grads: list[torch.Tensor],
    params: list[torch.Tensor],
    detail: bool,
    shared: list[torch.Tensor],
    kinds: list[int],
    *,
    reduce: bool = True,
) -> int:
    """This rank's figures of a sharded group (its parts of each gradient and weight), in
    the layout the reads place: each gradient's sum of squares, then on detail steps each
    weight's sum of squares and each gradient's max |g| (0 for an empty part). Sums are
    divided by the replicas so that the sum over ranks counts each shard once.
    ``reduce=False``: the gradients are this rank's own whole ones (FSDP1 no_sync), kept as
    they are. Fused calls: a few kernels per group, not per parameter. Returns the count."""
    count = len(grads)
    grad_kind = SUM if reduce else KEEP
    shared.append(squares_of(grads) / group.replicas if reduce else squares_of(grads))
    kinds += (grad_kind,) * count
    if not detail:
        return count
    shared.append(squares_of(params) / group.replicas)
    nonempty = [values_of(g) for g in grads if g.numel()]
    if not nonempty:
        found = iter(())
    elif nonempty[0].device.type in tensor_reads.PER_TENSOR_DEVICES:
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


class UnreducedCheck:
    """Whether FSDP1 units hold whole, unreduced gradients (a backward inside
    ``no_sync()``: gradient accumulation): the same answer on every rank, from the units'
    flat gradients, whose size is then the unit's, not the shard's. Warned once."""

    def __init__(self) -> None:
        self._warned = False

    def __call__(self, groups: list[ParameterGroup], exchange: Any) -> bool:
        flat_groups = [g for g in groups if g.flat is not None]
        if not flat_groups or exchange is None:
            return False
        handles = {id(spec.handle): spec.handle for g in flat_groups for spec in g.flat}
        unreduced = False
        for handle in handles.values():
            if handle is None:
                continue
            flat = handle.flat_param
            grad = flat.grad
            if grad is not None and grad.numel() != flat.numel():
                unreduced = True
                break
        if unreduced and not self._warned:
            self._warned = True
            warn_user(
                "gradscope.watch: collect() ran inside FSDP's no_sync() (gradient "
                "accumulation): each rank's gradients are its own and not yet reduced, so "
                "this step's gradient figures are this rank's. Call collect() after the "
                "backward that runs outside no_sync() for the model's"
            )
        return unreduced


def fact_device(exchange: Any) -> torch.device:
    if exchange is not None and exchange.backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rank_facts(loss: torch.Tensor | None, batch: Any, device: torch.device) -> list[torch.Tensor]:
    """This rank's facts for the step's exchange: loss, loss given, batch non-finite."""
    if loss is not None:
        device = loss.device
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


def read_rank_facts(values: np.ndarray, world: int, slots: int) -> RankFacts:
    per_rank = values.reshape(world, slots)
    return RankFacts(
        loss=per_rank[:, 0],
        loss_given=per_rank[:, 1] > 0,
        batch_nonfinite=per_rank[:, 2] > 0,
    )


def name_the_rank(origin: Origin, ranks: RankFacts, rank: int) -> None:
    """Which rank's batch or loss started the episode: in the origin of every rank."""
    broken = ranks.broken
    origin.details["rank"] = rank
    origin.details["ranks"] = ranks.to_dict()
    if not broken or rank in broken:
        return
    if origin.phase == "unknown":
        names = ", ".join(map(str, broken))
        origin.details["reason"] = (
            f"this rank's batch and loss were finite; rank {names} had a non-finite batch "
            "or loss at this step, and its NaN/Inf reached this rank through the gradient "
            f"all-reduce: see rank {broken[0]}'s origin"
        )
