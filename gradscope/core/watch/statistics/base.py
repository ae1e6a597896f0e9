"""What a statistic is: the public protocol (``gradscope.Statistic``) that users and the
built-in statistics alike implement (see gradscope.core.watch.statistics)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gradscope.core.facts import StatisticInfo

COMBINES = ("sum", "max", "rss", "mean")


class StatisticError(Exception):
    """A statistic's read raised or gave something that is not one value: the watch turns
    that statistic off (one warning naming it) and training goes on."""


class Statistic:
    """A per-layer figure of your own, measured by the watch beside its built-in ones.

    Subclass it and set ``name`` (the key in ``StepStats.figures``, recordings, JSON, CSV
    and tags), ``label`` (what the app's selector shows), ``combine`` (how a layer's figure
    follows from its parameters': ``"sum"``, ``"max"``, ``"rss"``, the root of their summed
    squares, or ``"mean"``) and ``every`` (measured at steps 0, every, 2*every, ...; None:
    the watch's ``detail_every``). Then define one of:

    - ``parameter(self, grad, weight)``: one parameter's figure from its gradient and weight,
      as a 0-d tensor on their device (never ``.item()``: the watch brings every figure of a
      step to the host in one transfer);
    - ``output(self, module, output)``: one watched module's figure from its forward output
      (a detached tensor), hooked only on the steps it is due.

    Either may return None instead: the statistic does not apply to that parameter or
    module (an attention-only figure on a feed-forward layer). A layer whose every
    contribution is None at a step is absent at it: NaN in ``StepStats.figures[name]`` and
    marked in ``StepStats.absent[name]``, shown as missing (never as a made-up 0) in the
    history, the recording, the reports and the exports. A layer with some real
    contributions gets its figure from those alone.

    A statistic that raises or returns anything but one value (or None) is turned off,
    with one warning naming it; training goes on.

    ``scale_power``: how a parameter statistic follows the gradients' scale under a loss
    scaler (1, the default, for a figure of the gradient such as a norm or an RMS; 0 for one
    that does not change with it, such as a count or a weight's figure): figures of
    still-scaled gradients are divided by the scale to this power.

    The batched form (:meth:`fused`, :meth:`stacked`) reads a whole group of parameters at
    once; by default it calls :meth:`parameter` for each. The built-in statistics override
    it with fused calls (the gradient norm is one ``torch._foreach_norm`` over every
    gradient). A batched form of width 1 may put None in place of a parameter's value
    (``stacked`` then returns the list rather than one vector); sharded (FSDP) reads take
    no None.
    """

    name: str = ""
    label: str = ""
    combine: str = "rss"
    every: int | None = None
    scale_power: int = 1
    # A parameter without a gradient this step keeps its last figure (a frozen layer's
    # weights do not change).
    kept: bool = False
    # Also read on a step that goes wrong or changes a layer's status, whatever its schedule
    # (the built-in detail that explains such a step).
    on_trouble: bool = False
    # The watch's own path reads it (the gradient norm every step, the NaN/Inf counts, the
    # update ratio after the optimizer), not the batched reads of this protocol.
    read_by_watch: bool = False
    # A watch option that must be on for it to be measured (say, "update_ratio_enabled").
    option: str | None = None

    def parameter(self, grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """One parameter's figure, a 0-d tensor on its device (None: not applicable)."""
        raise NotImplementedError

    def output(self, module: torch.nn.Module, output: torch.Tensor) -> torch.Tensor | None:
        """One watched module's figure from its forward output, a 0-d tensor (None: not
        applicable to this module)."""
        raise NotImplementedError

    @property
    def source(self) -> str:
        """What it reads: "output" (a module's forward output) or "parameter"."""
        return "output" if type(self).output is not Statistic.output else "parameter"

    def info(self, detail_every: int) -> StatisticInfo:
        """What a sink knows of it, its schedule resolved against the watch's."""
        return StatisticInfo(
            name=self.name,
            label=self.label,
            combine=self.combine,
            every=self.every if self.every is not None else detail_every,
            source=self.source,
        )

    # -- the batched form --------------------------------------------------------------------
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
    ) -> list[torch.Tensor | None]:
        """0-d tensors, :meth:`width` per parameter in order, for a group of large tensors
        (None where the statistic does not apply, with width 1). ``sizes``: each gradient's
        number of elements (None: a sparse group's, to be read from the gradients)."""
        return [
            one_value(self, self.parameter(g, p), g) for g, p in zip(grads, params, strict=True)
        ]

    def stacked(
        self, grads: list[torch.Tensor], params: list[torch.Tensor]
    ) -> torch.Tensor | list[torch.Tensor | None]:
        """One value per parameter for a group of small tensors of one shape, by one batch
        (or, where some do not apply, a list of 0-d tensors with None at those)."""
        found = self.fused(grads, params, per_tensor=False, sizes=None)
        if any(value is None for value in found):
            return found
        return torch.stack(found)

    def shard_values(self, grads: list[torch.Tensor], params: list[torch.Tensor]) -> torch.Tensor:
        """One value per parameter of this rank's (non-empty) parts of sharded parameters
        (FSDP), as a vector; the ranks' values are then reduced as ``combine`` says."""
        found = self.fused(grads, params, per_tensor=False, sizes=None)
        if any(value is None for value in found):
            raise StatisticError("returned None (not applicable) in a sharded read")
        return torch.stack(found)

    def from_fused(self, values: np.ndarray, per_tensor: bool) -> np.ndarray:
        """Per-parameter figures from :meth:`fused`'s slots."""
        return values

    def from_stacked(self, values: np.ndarray) -> np.ndarray:
        """Per-parameter figures from :meth:`stacked`'s values."""
        return values

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def with_placeholders(
    found: list[torch.Tensor | None], like: torch.Tensor
) -> tuple[list[torch.Tensor], list[int]]:
    """``found`` with a 0 in place of each None (so that the values stack and travel in the
    step's one transfer as before), and the positions of those Nones."""
    absent = [k for k, value in enumerate(found) if value is None]
    if not absent:
        return found, absent  # type: ignore[return-value]
    zero = like.new_zeros((), dtype=torch.float32)
    return [zero if value is None else value for value in found], absent


def one_value(statistic: Statistic, value: Any, like: torch.Tensor) -> torch.Tensor | None:
    """``value`` as one real 0-d tensor on ``like``'s device, None for None (not
    applicable: a Python fact, known without asking the device), or StatisticError. Only
    the tensor's metadata is looked at (no host synchronisation)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise StatisticError(f"returned {type(value).__name__}, not a tensor")
    if value.numel() != 1:
        raise StatisticError(f"returned a tensor of shape {tuple(value.shape)}, not one value")
    if value.device != like.device:
        raise StatisticError(f"returned a tensor on {value.device}, not on {like.device}")
    if value.is_complex():
        raise StatisticError("returned a complex tensor")
    value = value.detach().reshape(())
    if not value.is_floating_point():  # a count or a flag: stacks with the float figures
        value = value.float()
    return value
