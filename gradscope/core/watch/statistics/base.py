"""What a detail statistic is: one figure per parameter, read by batched calls, and how a
layer's figure follows from its parameters' (see gradscope.core.watch.statistics)."""

from __future__ import annotations

import numpy as np
import torch


class Statistic:
    """One figure per parameter, read on detail steps.

    ``name``: its key (``StepStats.figures[name]``, or a built-in field). ``per_layer``:
    ``"l2"`` (a layer's figure is the root of its parameters' sums of squares), ``"max"`` or
    ``"sum"`` (a count).
    ``scale_power``: how the figure follows the gradients' scale (1 for a norm or max |g| of
    the gradient, 0 for the weights'): under a loss scaler the figures of still-scaled
    gradients are divided by the scale to this power. ``kept``: a parameter without a
    gradient this step keeps its last figure (the weights of a frozen layer do not change).

    Each read is batched over the group: no call per tensor on the device, no host
    synchronisation (the step's one transfer brings every figure).
    """

    name: str = ""
    per_layer: str = "l2"
    scale_power: int = 1
    kept: bool = False

    def width(self, per_tensor: bool) -> int:
        """Slots per parameter of :meth:`fused` (``per_tensor``: the device is one where a
        per-tensor call beats the fused one, a CPU)."""
        return 1

    def fused(
        self,
        grads: list[torch.Tensor],
        params: list[torch.Tensor],
        *,
        per_tensor: bool,
        sizes: tuple[int, ...] | None,
    ) -> list[torch.Tensor]:
        """0-d tensors, :meth:`width` per parameter in order, for a group of large tensors.
        ``sizes``: each gradient's number of elements (None: a sparse group's, to be read
        from the gradients)."""
        raise NotImplementedError

    def stacked(self, grads: list[torch.Tensor], params: list[torch.Tensor]) -> torch.Tensor:
        """One value per parameter for a group of small tensors of one shape, by one batch."""
        raise NotImplementedError

    def from_fused(self, values: np.ndarray, per_tensor: bool) -> np.ndarray:
        """Per-parameter figures from :meth:`fused`'s slots."""
        return values

    def from_stacked(self, values: np.ndarray) -> np.ndarray:
        """Per-parameter figures from :meth:`stacked`'s values (and a sharded group's)."""
        return values
