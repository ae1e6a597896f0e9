"""The update ratio ||Δw||/||w|| per layer: the watched weights are copied on a detail step
before the optimizer steps, and the difference is read after it.

Under sharding (FSDP) no collective runs in the optimizer hook (a rank whose step was skipped
would leave the others waiting there): this rank's sums of squares of Δw travel with the next
step's exchange, with a count of the ranks that stepped."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gradscope.core.facts import StepStats
from gradscope.core.sharded import SUM
from gradscope.core.watch.binding import Binding
from gradscope.core.watch.figures import accumulation_dtype, squares_of
from gradscope.core.watch.host import to_host


@dataclass
class _PendingUpdate:
    """An optimizer step's update under sharding, waiting for the next exchange: the stats
    it belongs to, the whole parameters' ||Δw|| (done), and per sharded group this rank's
    sums of squares of Δw with the group's replicas."""

    stats: StepStats
    delta: np.ndarray
    parts: list[tuple[np.ndarray, torch.Tensor, int]]


class UpdateRatio:
    def __init__(self, exchange, fact_device) -> None:
        self._exchange = exchange
        self._fact_device = fact_device
        # (indices, weights, their copies, replicas: 0 unless sharded) per group
        self.weights_before: list[tuple[np.ndarray, list, list[torch.Tensor], int]] | None = None
        # Under sharding: how many sharded slots the next exchange holds, and the measured
        # sums waiting for it.
        self.slots = 0
        self._pending: _PendingUpdate | None = None

    def start(self) -> None:
        """A detail step begins: its weights are copied group by group (``copy``)."""
        self.weights_before = []

    def clear(self) -> None:
        self.weights_before = None

    @torch.no_grad()
    def copy(
        self, indices: np.ndarray, params: list[torch.Tensor], replicas: int, *, sharded: bool
    ) -> None:
        assert self.weights_before is not None
        self.weights_before.append((indices, params, torch._foreach_mul(params, 1.0), replicas))
        if sharded and self._exchange is not None:
            self.slots += len(params)

    @torch.no_grad()
    def measure(self, binding: Binding, last: StepStats | None) -> np.ndarray | None:
        """After ``optimizer.step()``: ||Δw||/||w|| per layer for the last collected step
        (None under sharding: the next exchange completes it)."""
        if self.weights_before is None or last is None:
            return None
        delta = np.zeros(len(binding.params))
        pending = []
        shard_parts = []
        for indices, now, before, copies in self.weights_before:
            diffs = torch._foreach_sub(now, before)
            if copies and self._exchange is not None:
                shard_parts.append((indices, squares_of(diffs), copies))
                continue
            norms = torch._foreach_norm(diffs, 2, dtype=accumulation_dtype(now[0]))
            pending.append((indices, torch.stack(norms)))
        for indices, norms in pending:
            delta[indices] = to_host(norms.double())
        self.weights_before = None
        if shard_parts:
            self._pending = _PendingUpdate(last, delta, shard_parts)
            return None
        return set_update_ratio(binding, last, delta)

    def send(self, shared: list[torch.Tensor], kinds: list[int]) -> int:
        """Queue the last update's sharded sums (zeros where this rank's optimizer did not
        step) and a count of the ranks that stepped into this step's exchange; returns the
        slot count."""
        count, pending = self.slots, self._pending
        device = self._fact_device()
        if pending is not None:
            sums = [squares / copies for _, squares, copies in pending.parts]
            shared.append(torch.cat([*sums, torch.ones(1, dtype=torch.float64, device=device)]))
        else:
            shared.append(torch.zeros(count + 1, dtype=torch.float64, device=device))
        kinds += (SUM,) * (count + 1)
        self.slots = 0
        return count

    def receive(self, binding: Binding, values: np.ndarray) -> None:
        """The last update's sums over the ranks: its stats' update ratio, when every rank
        stepped (otherwise the ranks' weights parted ways, and no ratio is made up)."""
        pending, self._pending = self._pending, None
        if pending is None or self._exchange is None or values[-1] < self._exchange.world:
            return
        delta, cursor = pending.delta, 0
        for indices, squares, _ in pending.parts:
            delta[indices] = np.sqrt(values[cursor : cursor + len(squares)])
            cursor += len(squares)
        set_update_ratio(binding, pending.stats, delta)


def set_update_ratio(binding: Binding, stats: StepStats, delta: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        layer_delta = np.sqrt(np.add.reduceat(np.square(delta[binding.members]), binding.offsets))
        weight = stats.weight_norm
        ratio = np.where(weight > 0, layer_delta / weight, np.where(layer_delta > 0, np.inf, 0.0))
    stats.update_ratio = ratio
    return ratio
