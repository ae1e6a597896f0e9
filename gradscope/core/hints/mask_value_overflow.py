"""Evidence: an addition or subtraction made Inf from finite inputs, and one of its inputs
holds its dtype's extreme value exactly (``torch.finfo(dtype).min`` or ``.max``, recorded
as its min or max): an additive mask filled with the dtype's minimum, added to another
such mask (or to a negative score), overflows to -inf, which is then a -inf mask nobody
wrote."""

from __future__ import annotations

import torch

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, dtype_of, operands, where

SUMS = {"add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "addcmul", "add_"}


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or origin.kind != "inf" or base_op(origin.op) not in SUMS:
        return None
    fed = operands(origin)
    dtype = dtype_of(fed)
    kind = getattr(torch, dtype or "", None)
    if not isinstance(kind, torch.dtype) or not kind.is_floating_point:
        return None
    info = torch.finfo(kind)
    extreme = [v for v in fed if v.get("min") == info.min or v.get("max") == info.max]
    if not extreme:
        return None
    return (
        f"{where(origin)} added values that hold torch.finfo({dtype}).min (or .max) "
        f"exactly, {info.min:.6g} in {dtype}: an additive mask filled with the dtype's "
        "extreme, added to a second mask or to a negative score, overflows to -inf (and a "
        "row that ends up all -inf gives NaN in softmax). Combine the masks before filling "
        "(keep = keep_a & keep_b, then one masked_fill): the usual fix; or clamp the sum "
        f"back (x.clamp_min(torch.finfo({dtype}).min))."
    )
