"""Exact figures, read on the rare steps that need them: NaN and Inf counted apart (and a
real Inf told from a sum of squares that overflowed), norms too small or too large for float
squares, and the unwatched gradients whose fast figures were not finite. Each is one batched
read per device; sharded figures are summed over the ranks (every rank gets here at the same
step, since the figures that send it here were reduced)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gradscope.core.sharded import local
from gradscope.core.watch.binding import Binding, ParameterGroup
from gradscope.core.watch.figures import exact_norms_of, values_of
from gradscope.core.watch.host import to_host


class ExactReads:
    """The exact reads of one watch (its binding and exchange; ``unreduced``: FSDP1 under
    ``no_sync()``, each rank's own whole gradients, summed over no rank)."""

    def __init__(self, binding: Binding, exchange: Any, unreduced: bool) -> None:
        self.binding = binding
        self.exchange = exchange
        self.unreduced = unreduced

    def _summed(self, tensor: torch.Tensor) -> torch.Tensor:
        """A sum over the ranks of sharded figures (none without an exchange)."""
        if self.exchange is None:
            return tensor
        return self.exchange.all_reduce_sum(tensor)

    def local_grad(self, index: int) -> torch.Tensor:
        """This rank's part of a watched parameter's gradient (empty where an FSDP1 rank
        holds none of it)."""
        param = self.binding.params[index]
        grad = param.grad
        if grad is None:
            return param.detach().reshape(-1)[:0]
        return local(grad)

    def count_nonfinite(
        self,
        suspects: np.ndarray,
        param_norm: np.ndarray,
        nan_out: np.ndarray,
        inf_out: np.ndarray,
    ) -> None:
        """NaN and Inf counts of the suspect parameters; those with neither (a sum of squares
        that overflowed) get their exact norm."""
        grads = [self.local_grad(index) for index in suspects]
        by_device: dict[torch.device, list[int]] = {}
        for k, grad in enumerate(grads):
            by_device.setdefault(grad.device, []).append(k)
        counts: list[Any] = [None] * len(grads)
        replicas = self.binding.replicas
        for positions in by_device.values():  # one read per device
            values = [values_of(grads[k]) for k in positions]
            pairs = torch.stack([torch.stack([v.isnan().sum(), v.isinf().sum()]) for v in values])
            sharded = [i for i, k in enumerate(positions) if replicas[suspects[k]]]
            if sharded and self.exchange is not None and not self.unreduced:
                # Shards' counts summed over the ranks, each shard once; other parameters'
                # are this rank's.
                copies = torch.tensor(
                    [int(replicas[suspects[positions[i]]]) for i in sharded],
                    device=pairs.device,
                )
                summed = self._summed(pairs[sharded].contiguous())
                pairs[sharded] = torch.div(summed, copies[:, None], rounding_mode="floor")
            for k, pair in zip(positions, to_host(pairs), strict=True):
                counts[k] = pair
        finite = []
        for index, (nans, infs) in zip(suspects, counts, strict=True):
            nan_out[index], inf_out[index] = int(nans), int(infs)
            if nans == 0 and infs == 0:
                finite.append(index)
        if finite:
            param_norm[finite] = self.norms(np.asarray(finite, dtype=np.intp))

    def norms(self, indices: np.ndarray) -> np.ndarray:
        """Exact L2 norms of several watched parameters' gradients: one fused float64 read
        per device (never a call per tensor). Shards: float64 sums of squares summed over
        the ranks, each shard once."""
        indices = np.asarray(indices, dtype=np.intp)
        grads: list[torch.Tensor | None] = [self.local_grad(i) for i in indices.tolist()]
        out = np.zeros(len(grads))
        copies = self.binding.replicas[indices]
        sharded = np.flatnonzero(copies)
        if len(sharded) and self.exchange is not None and not self.unreduced:
            values = [values_of(grads[k]) for k in sharded]
            squares = exact_norms_of(values).square()
            summed = self._summed(squares)
            out[sharded] = np.sqrt(to_host(summed) / copies[sharded])
            grads = [g if not copies[k] else None for k, g in enumerate(grads)]
        by_device: dict[torch.device, list[int]] = {}
        for k, grad in enumerate(grads):
            if grad is not None:
                by_device.setdefault(grad.device, []).append(k)
        for positions in by_device.values():
            values = [values_of(grads[k].detach()) for k in positions]
            out[positions] = to_host(exact_norms_of(values))
        return out

    def unwatched_squares(self, bad: list[tuple[ParameterGroup, list[int]]]) -> float:
        """The exact sum of squares of unwatched gradients whose fast figures were not
        finite (NaN if any element really is): one host read per group."""
        total = 0.0
        for group, present in bad:
            grads = []
            for i in present:
                grad = group.params[i].grad
                if grad is None:  # an FSDP1 rank that holds none of this parameter
                    grad = group.params[i].detach().reshape(-1)[:0]
                grads.append(values_of(local(grad)).double())
            figures = torch.stack(
                [
                    torch.stack([(~torch.isfinite(g)).sum().double(), g.square().sum()])
                    for g in grads
                ]
            ).sum(dim=0)
            if group.sharded and self.exchange is not None and not self.unreduced:
                figures = self._summed(figures)
                figures[1] /= group.replicas
            bad_elements, squares = to_host(figures).tolist()
            if bad_elements:
                return float("nan")
            total += squares
        return total
