"""Where a by-design -inf goes: carried, consumed, or aggregated into an Inf nobody meant.

A ``-inf`` written on purpose (``masked_fill(mask, -inf)``, an additive 0/-inf mask in the
batch, a causal mask buffer) is no error while ops carry it position by position (an add,
a negation, ``log_softmax``, ``gather``) or consume it safely (``softmax`` and
``logsumexp`` turn it into 0 weight). It becomes one when an op sums or multiplies it
together with other values into a result that is itself infinite: label smoothing that sums
``-log_softmax`` over a masked vocabulary gets +inf; the matrix product of a masked matrix
gets Inf. That op made the Inf, although its inputs already held one.

:class:`MaskProvenance` tells, for a tensor holding Inf, whether its Infs come from such a
mask (seeded by the tracer, then followed op by op); :func:`aggregated_operands` names the
operands an op reduces over (None for ops that work position by position or consume a mask
safely).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable
from typing import Any

import torch

# ops that add up or multiply together many values of an operand (all of its tensors)
_REDUCING_ALL = {
    "sum",
    "mean",
    "nansum",
    "nanmean",
    "prod",
    "cumsum",
    "cumprod",
    "norm",
    "vector_norm",
    "matrix_norm",
    "var",
    "std",
    "trace",
    "matmul",
    "mm",
    "bmm",
    "mv",
    "dot",
    "vdot",
    "inner",
    "tensordot",
    "einsum",
    "kron",
    "cross_entropy",
    "nll_loss",
    "kl_div",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "poisson_nll_loss",
    "gaussian_nll_loss",
}
# ops whose first tensor is only added position by position (a bias, an additive mask):
# the product of the others is the reduction
_REDUCING_AFTER_FIRST = {"addmm", "baddbmm", "addbmm", "addmv", "addr"}
# ops whose first two tensors (input and weight) are reduced over; the bias is added
_REDUCING_FIRST_TWO = {"linear", "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose2d"}


def _base_name(func: Any) -> str:
    name = getattr(func, "__name__", "")
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        if name.startswith("i") and name[1:] in ("matmul",):
            name = name[1:]
    elif name.endswith("_"):
        name = name[:-1]
    return name


def aggregated_operands(func: Any, tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The operands ``func`` sums or multiplies over (given its floating-point tensor
    arguments in order), or None when it works position by position or consumes a mask
    safely (``softmax``, ``logsumexp``, ``max``, ``masked_fill``, ``where``...)."""
    name = _base_name(func)
    if name in _REDUCING_ALL:
        return tensors
    if name in _REDUCING_AFTER_FIRST:
        return tensors[1:]
    if name in _REDUCING_FIRST_TWO:
        return tensors[:2]
    return None


def holds_inf(tensor: torch.Tensor) -> bool:
    data = tensor.detach()
    return bool(data.numel()) and data.is_floating_point() and bool(torch.isinf(data).any())


def looks_like_mask(tensor: torch.Tensor) -> bool:
    """Only -inf among its non-finite values and nothing above 0 besides: an additive
    0/-inf mask or log-probabilities, as the batch check judges them."""
    data = tensor.detach()
    if not data.is_floating_point() or bool(torch.isnan(data).any()):
        return False
    if bool((data == math.inf).any()):
        return False
    finite = data[torch.isfinite(data)]
    return not finite.numel() or float(finite.max()) <= 0.0


class MaskProvenance:
    """Which Inf-holding tensors of one traced step carry a by-design mask, and which an
    Inf that something made (an overflow, a log of 0, an Inf in the data). Keyed by the
    tensor's identity (a tensor's ``==`` compares values, so no set of tensors)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[weakref.ref, bool]] = {}

    def is_mask(self, tensor: torch.Tensor) -> bool:
        """Its Infs come from a mask: followed from one or, never made by a traced op (the
        batch, a buffer, a constant), it looks like one."""
        entry = self._seen.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        return looks_like_mask(tensor)

    def all_masks(self, tensors: Iterable[torch.Tensor]) -> bool:
        """Every Inf-holding tensor among ``tensors`` carries a mask (False when none holds
        an Inf)."""
        holding = [t for t in tensors if holds_inf(t)]
        return bool(holding) and all(self.is_mask(t) for t in holding)

    def record(self, outputs: Iterable[torch.Tensor], mask: bool) -> None:
        """What an op's Inf-holding outputs carry: a mask, or an Inf that was made."""
        for tensor in outputs:
            if holds_inf(tensor):
                self._seen[id(tensor)] = (weakref.ref(tensor), mask)
