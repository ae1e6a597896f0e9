"""What an origin recorded, read the way every hint rule needs it: the values that went
into and came out of the op, what the backward saved, the dtype, the op's plain name."""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from gradscope.core.facts import Origin

FLOAT16_MAX = 65504.0


def base_op(op: str | None) -> str:
    """``torch.log`` -> ``log``; ``Tensor.sqrt_`` -> ``sqrt``; drops a backward suffix."""
    if not op:
        return ""
    name = op.split(" ")[0].rsplit(".", 1)[-1]
    name = re.sub(r"^__i(\w+)__$", r"__\1__", name)
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def where(origin: Origin) -> str:
    """The op as the user wrote it (``torch.log``), without a backward suffix."""
    return origin.op.split(" backward")[0] if origin.op else "this operation"


def values(origin: Origin, key: str) -> list[dict[str, Any]]:
    return list(origin.details.get("values", {}).get(key, []))


def evidence(origin: Origin, key: str) -> Any:
    return (origin.details.get("evidence") or {}).get(key)


def min_input(origin: Origin) -> float | None:
    mins = [v["min"] for v in values(origin, "inputs") if "min" in v]
    return min(mins) if mins else None


def max_abs(stats: list[dict[str, Any]]) -> float:
    return max((max(abs(v.get("min", 0.0)), abs(v.get("max", 0.0))) for v in stats), default=0.0)


def finite_max_abs(stats: list[dict[str, Any]]) -> float:
    """The largest finite magnitude among ``stats``' min and max."""
    found = [abs(v[k]) for v in stats for k in ("min", "max") if k in v and math.isfinite(v[k])]
    return max(found, default=0.0)


def dtype_of(stats: list[dict[str, Any]]) -> str | None:
    return next((v["dtype"] for v in stats if "dtype" in v), None)


def is_half(stats: list[dict[str, Any]]) -> bool:
    return any(v.get("dtype") in ("float16", "bfloat16") for v in stats)


def holds_inf(stats: list[dict[str, Any]]) -> bool:
    return any(v.get("inf") for v in stats)


def holds_nan(stats: list[dict[str, Any]]) -> bool:
    return any(v.get("nan") for v in stats)


def saved(origin: Origin, *names: str) -> dict[str, Any] | None:
    """What an autograd node saved from the forward, by its name (``self``, ``other``,
    ``result``)."""
    kept = values(origin, "saved")
    for name in names:
        found = next((v for v in kept if v.get("name") == name), None)
        if found is not None:
            return found
    return None


def fmt(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.3g}"


def exp_limit(dtype: str) -> float | None:
    """The largest x whose exp(x) is finite in ``dtype`` (88.7 in float32, 11.1 in float16)."""
    found = getattr(torch, dtype, None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        return None
    return math.log(torch.finfo(found).max)


def operands(origin: Origin) -> list[dict[str, Any]]:
    """The op's recorded inputs without the module's buffers (a BatchNorm's ``running_var``
    is an argument of ``F.batch_norm``, not a value the layer was fed)."""
    return [v for v in values(origin, "inputs") if not v.get("buffer")]


def argument(origin: Origin, *names: str) -> Any:
    """A plain (non-tensor) argument of the op by name (``exponent``, ``label_smoothing``;
    ``arg1`` for a builtin's second positional argument), the first of ``names`` given."""
    given = evidence(origin, "arguments") or {}
    return next((given[name] for name in names if name in given), None)


def divisor(origin: Origin) -> tuple[str, dict[str, Any]] | None:
    """What a log or division backward divides by, as it saved it: the denominator
    (``other``) of a division, the ``y`` (``other``) of ``xlogy(x, y)``, the input
    (``self``) of a log; with the name it was saved under."""
    op = base_op(origin.op)
    names = ("other", "self") if op in ("xlogy", "div", "true_divide", "divide") else ("self",)
    if op in ("__truediv__", "__rtruediv__", "atan2", "fmod", "remainder"):
        names = ("other", "self")
    for name in names:
        found = saved(origin, name)
        if found is not None:
            return name, found
    return None


def scaler_and_autocast(origin: Origin) -> tuple[bool, str | None]:
    """Whether the script's loop has a loss scaler (the watch says so) and the autocast
    dtype that was in force when the op ran."""
    return bool(origin.details.get("loss_scaler")), evidence(origin, "autocast")


def origin_of_inf(origin: Origin) -> str:
    """Where the -inf an op was given was written on purpose (``masked_fill(..., -inf)``),
    as ``masked_fill at file:line (module m)``; "" when the tracer did not see it."""
    source = evidence(origin, "inf_from") or {}
    if not source:
        return ""
    at = f" at {source['file']}:{source['line']}" if source.get("line") else ""
    code = f" ({source['code'].strip()})" if source.get("code") else ""
    module = source.get("module")
    inside = " in the loss code" if module is None else f" in module {module or '(model root)'!r}"
    return f"{source.get('op', 'an op')}{at}{code}{inside}"
