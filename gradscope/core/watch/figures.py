"""The tensor reads a step's statistics are made of, each a batched op over many tensors:
fused ``_foreach_norm`` calls over a group's large tensors, one stacked batch over a group of
small tensors of one shape, and the exact float64 reads of rare steps. Nothing here
synchronises with the device."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradscope.core.sharded import local

HALF_DTYPES = (torch.float16, torch.bfloat16)
# By accumulation dtype: the max |g| (or, without max |g|, the norm) under which float
# squares underflow and a fused norm (torch's own included) loses precision or reads 0; such
# gradients are read again exactly in float64 (see gradscope.core.watch.exact).
TINY = {torch.float32: 1e-15, torch.float64: 1e-140}
# Device types whose max |g| of large tensors is read by one aminmax per tensor rather than
# by the fused ``_foreach_norm`` ord inf (several times slower there); the tests also run
# the fused path on CPU by emptying this.
PER_TENSOR_DEVICES: tuple[str, ...] = ("cpu",)


def accumulation_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    """Half-precision norms accumulate in float32, so a finite fp16 gradient never reads a
    false Inf."""
    return torch.float32 if tensor.dtype in HALF_DTYPES else None


def tiny_bound(tensor: torch.Tensor) -> float:
    return TINY[torch.float64 if tensor.dtype == torch.float64 else torch.float32]


def values_of(grad: torch.Tensor) -> torch.Tensor:
    """The numbers of a gradient: a sparse gradient's stored values, a complex one's moduli
    (so that max |g| and the NaN/Inf counts read what they say)."""
    grad = local(grad)
    if grad.layout != torch.strided:
        grad = grad.coalesce().values()
    return grad.abs() if grad.is_complex() else grad


def squares_of(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sums of squares of several tensors as one float64 vector, by one fused call (empty
    tensors give 0; NaN and Inf propagate)."""
    norms = torch._foreach_norm(list(tensors), 2, dtype=accumulation_dtype(tensors[0]))
    return torch.stack(norms).double().square()


def stacked_squares(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Float64 sums of squares of tensors of one shape, by stacking them into one batch: a
    float32 square never underflows or overflows in float64, so a tiny gradient reads its
    true norm on every step, and NaN/Inf propagate."""
    batch = torch.stack(list(tensors)).reshape(len(tensors), -1).double()
    return batch.square_().sum(dim=1)


def stacked_max(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Max |g| of tensors of one shape, by stacking them (NaN propagates)."""
    batch = torch.stack(list(tensors)).reshape(len(tensors), -1)
    return batch.abs().amax(dim=1)


def exact_norms_of(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Exact L2 norms of float32 or half tensors by one fused call accumulating in float64
    (no square underflows or overflows there); float64 tensors are scaled by their max |g|
    first, one by one (rare: their squares underflow only below 1e-154)."""
    values = [v.reshape(-1) for v in values]
    wide = [k for k, v in enumerate(values) if v.dtype == torch.float64]
    if not wide:
        return torch.stack(torch._foreach_norm(values, 2, dtype=torch.float64))
    out = []
    for v in values:
        if v.dtype != torch.float64:
            out.append(torch.linalg.vector_norm(v, dtype=torch.float64))
            continue
        if not v.numel():
            out.append(v.new_zeros(()))
            continue
        scale = v.abs().max()
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        out.append(scale * torch.linalg.vector_norm(v / safe))
    return torch.stack(out)
