"""The watch under torch.distributed: this rank's parts of sharded groups, read in the layout
the step's one exchange reduces (see gradscope.core.sharded), and the per-rank facts that
travel with it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gradscope.core.facts import Origin, RankFacts
from gradscope.core.sharded import KEEP, MAX, SUM, local
from gradscope.core.tensor_tree import float_tensors
from gradscope.core.user_warnings import warn_user
from gradscope.core.watch.binding import ParameterGroup
from gradscope.core.watch.figures import squares_of
from gradscope.core.watch.statistics import Statistic, StatisticError


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
    reads: tuple[Statistic, ...],
    shared: list[torch.Tensor],
    kinds: list[int],
    *,
    reduce: bool = True,
    statistics: Any = None,
) -> int:
    """This rank's figures of a sharded group (its parts of each gradient and weight), in
    the layout the reads place: each gradient's sum of squares, then each statistic of
    ``reads`` over the parts (:func:`sharded_width` slots per parameter), reduced over the
    ranks as its ``combine`` says: "sum" summed, "max" their maximum, "rss" their squares
    summed, "mean" a sum and a count; an empty part adds nothing. Sums are divided by the
    replicas so that the sum over ranks counts each shard once. ``reduce=False``: the
    gradients are this rank's own whole ones (FSDP1 no_sync), kept as they are. Batched
    calls: a few kernels per group and statistic, not per parameter. A statistic that
    fails is told to ``statistics`` (its slots then hold 0). Returns the count."""
    count = len(grads)
    shared.append(squares_of(grads) / group.replicas if reduce else squares_of(grads))
    kinds += (SUM if reduce else KEEP,) * count
    if not reads:
        return count
    nonempty = [k for k, g in enumerate(grads) if g.numel()]
    all_there = len(nonempty) == count
    some_grads = grads if all_there else [grads[k] for k in nonempty]
    some_params = params if all_there else [params[k] for k in nonempty]
    device = grads[0].device
    for statistic in reads:
        values = None
        if nonempty:
            try:
                values = _shard_values(statistic, some_grads, some_params)
            except Exception as error:  # a user's statistic: turned off after this step
                if statistics is None:
                    raise
                statistics.failed(statistic, error)
        if values is None:
            values = torch.zeros(len(nonempty), dtype=torch.float64, device=device)
        if not all_there:
            # No index tensor (a host-to-device copy): the empty parts' zeros stacked in.
            pieces = iter(values.unbind())
            zero = values.new_zeros(())
            values = torch.stack([next(pieces) if g.numel() else zero for g in grads])
        # A figure of the weights alone (kept: it does not follow the gradients) is of
        # shards even when the gradients are each rank's own whole ones.
        summed = reduce or statistic.kept
        copies = group.replicas if summed else 1
        combine = statistic.combine
        if combine == "max":
            shared.append(values)
            kinds += (MAX if summed else KEEP,) * count
            continue
        if combine == "rss":
            values = values.square()
        shared.append(values / copies)
        kinds += (SUM if summed else KEEP,) * count
        if combine == "mean":  # and how many parts it averages over
            # Made on the device (no host-to-device copy): ones and zeros stacked.
            one, zero = values.new_ones(()), values.new_zeros(())
            present = torch.stack([one if g.numel() else zero for g in grads])
            shared.append(present / copies)
            kinds += (SUM if summed else KEEP,) * count
    return count


def _shard_values(
    statistic: Statistic, grads: list[torch.Tensor], params: list[torch.Tensor]
) -> torch.Tensor:
    """One float64 value per (non-empty) part, on the parts' device."""
    values = statistic.shard_values(grads, params)
    if not isinstance(values, torch.Tensor) or values.shape != (len(grads),):
        raise StatisticError("did not give one value per parameter")
    return values.double()


def sharded_width(statistic: Statistic) -> int:
    """Slots per parameter of a statistic in a sharded group's exchange."""
    return 2 if statistic.combine == "mean" else 1


def from_sharded(statistic: Statistic, values: np.ndarray, count: int) -> np.ndarray:
    """Per-parameter figures from a sharded group's reduced slots (see queue_sharded)."""
    if statistic.combine == "rss":
        return np.sqrt(values)
    if statistic.combine == "mean":
        sums, parts = values[:count], values[count:]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(parts > 0, sums / parts, 0.0)
    return values


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
