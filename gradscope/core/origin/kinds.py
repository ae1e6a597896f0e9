"""Which non-finite kinds (NaN, Inf) tensors hold, and the short summary of a value an
origin keeps. All of it reads detached values.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _flags(tensors: list[torch.Tensor]) -> tuple[bool, bool]:
    """(has NaN, has Inf) over ``tensors``, looking at detached values only."""
    nan = inf = False
    for tensor in tensors:
        if not tensor.numel():
            continue
        data = tensor.detach()
        if bool(torch.isfinite(data).all()):
            continue
        nan = nan or bool(torch.isnan(data).any())
        inf = inf or bool(torch.isinf(data).any())
        if nan and inf:
            break
    return nan, inf


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t.detach()).all()) for t in tensors if t.numel())


def _kind(tensors: list[torch.Tensor]) -> str:
    return "nan" if _flags(tensors)[0] else "inf"


def _new_kind(
    inputs: tuple[bool, bool], outputs: tuple[bool, bool], by_design: frozenset[str] = frozenset()
) -> str | None:
    """The non-finite kind an output holds that its inputs did not: NaN from NaN-free inputs,
    or Inf from Inf-free inputs; None when it only carries what came in (an additive -inf
    mask passing through is not an error)."""
    in_nan, in_inf = inputs
    out_nan, out_inf = outputs
    if out_nan and not in_nan and "nan" not in by_design:
        return "nan"
    if out_inf and not in_inf and not in_nan and "inf" not in by_design:
        return "inf"
    return None


def tensor_summary(tensor: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype, NaN and Inf counts, min and max (``-inf``/``inf`` when the tensor holds
    them) and the mean of the finite values."""
    data = tensor.detach()
    summary: dict[str, Any] = {
        "shape": list(data.shape),
        "dtype": str(data.dtype).replace("torch.", ""),
        "nan": 0,
        "inf": 0,
    }
    if not data.numel():
        return summary
    if not data.is_floating_point():
        as_float = data.double()
        summary.update(
            min=float(as_float.min()), max=float(as_float.max()), mean=float(as_float.mean())
        )
        return summary
    finite_mask = torch.isfinite(data)
    summary["nan"] = int(torch.isnan(data).sum())
    summary["inf"] = int(torch.isinf(data).sum())
    zeros = int((data == 0).sum())
    if zeros:
        summary["zeros"] = zeros  # a 0/0 or a log of 0 shows here
    finite = data[finite_mask].float()
    if finite.numel():
        low, high = float(finite.min()), float(finite.max())
        summary["mean"] = float(finite.mean())
    else:
        low, high = math.inf, -math.inf
    if summary["inf"]:
        if bool((data == -math.inf).any()):
            low = -math.inf
        if bool((data == math.inf).any()):
            high = math.inf
    if low <= high:
        summary["min"], summary["max"] = low, high
    return summary
