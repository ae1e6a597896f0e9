"""Plain-language hints: what most likely made the first NaN/Inf, and the usual remedies.

Chosen from what localisation found: the phase, the operation, the kind of value, and the
values that went into it (e.g. "input min 0 into log").
"""

from __future__ import annotations

import re
from typing import Any

from gradscope.core.origin import Origin

FLOAT16_MAX = 65504.0

_LOG = {"log", "log2", "log10", "log1p", "xlogy", "log_softmax", "logit", "digamma", "lgamma"}
_SQRT = {"sqrt", "rsqrt", "pow", "__pow__", "__rpow__", "float_power", "norm", "vector_norm"}
_DIVIDE = {
    "div",
    "true_divide",
    "__truediv__",
    "__rtruediv__",
    "reciprocal",
    "__itruediv__",
    "divide",
    "fmod",
    "remainder",
    "atan2",
}
_EXP = {
    "exp",
    "exp2",
    "expm1",
    "sinh",
    "cosh",
    "softplus",
    "__mul__",
    "mul",
    "matmul",
    "mm",
    "bmm",
    "linear",
    "conv1d",
    "conv2d",
    "conv3d",
    "addmm",
    "baddbmm",
    "einsum",
    "sum",
    "mean",
}
_SOFTMAX = {
    "softmax",
    "scaled_dot_product_attention",
    "multi_head_attention_forward",
    "_softmax",
    "_masked_softmax",
}


def base_op(op: str | None) -> str:
    """``torch.log`` -> ``log``; ``Tensor.sqrt_`` -> ``sqrt``; drops a backward suffix."""
    if not op:
        return ""
    name = op.split(" ")[0].rsplit(".", 1)[-1]
    name = re.sub(r"^__i(\w+)__$", r"__\1__", name)
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _values(origin: Origin, key: str) -> list[dict[str, Any]]:
    return list(origin.details.get("values", {}).get(key, []))


def _min_input(origin: Origin) -> float | None:
    mins = [v["min"] for v in _values(origin, "inputs") if "min" in v]
    return min(mins) if mins else None


def _max_abs(stats: list[dict[str, Any]]) -> float:
    return max((max(abs(v.get("min", 0.0)), abs(v.get("max", 0.0))) for v in stats), default=0.0)


def _half(stats: list[dict[str, Any]]) -> bool:
    return any(v.get("dtype") in ("float16", "bfloat16") for v in stats)


def hint_for(origin: Origin) -> str:
    op = base_op(origin.op)
    inputs = _values(origin, "inputs")
    outputs = _values(origin, "outputs")
    low = _min_input(origin)
    where = origin.op.split(" backward")[0] if origin.op else "this operation"

    if origin.phase == "update":
        weights = _values(origin, "weights")
        half = _half(weights)
        return (
            f"The weights of {origin.module or '(model)'} were already NaN/Inf before this "
            f"step's forward pass: the optimizer update ({origin.op or 'optimizer.step'}) of "
            "the previous step wrote them. "
            + (
                "They are half precision: Adam's eps (1e-8) rounds to 0 in float16, so "
                "an update divides by zero, and small updates underflow. Keep float32 master "
                "weights (autocast + GradScaler), use bfloat16, or raise eps to 1e-4. "
                if half
                else "A learning rate too high for these gradients is the usual cause: lower "
                "it, clip gradients, or check for a division by a tiny second-moment estimate. "
            )
            + "Rewind to before that step to try another setting."
        )

    if origin.phase == "backward":
        if op in ("sqrt", "rsqrt", "pow", "norm", "vector_norm"):
            return (
                f"The derivative of {where} is infinite at 0 (d/dx sqrt(x) = 1/(2 sqrt(x))): the "
                "forward pass was finite but the gradient is not. Add a small epsilon inside "
                "(sqrt(x + 1e-12)), clamp the input away from 0, or use a safe norm that "
                "special-cases zero vectors."
            )
        if op in _LOG or op in _DIVIDE:
            return (
                f"The gradient of {where} divides by its input, which is (close to) zero here. "
                "Add an epsilon (log(x + eps), x / (y + eps)) or clamp the input."
            )
        if op in ("acos", "asin", "atanh"):
            return (
                f"The derivative of {where} is infinite at +-1. Clamp the input to "
                "[-1 + eps, 1 - eps]."
            )
        incoming = _values(origin, "grad_in")
        if _half(incoming) or _half(_values(origin, "grad_out")):
            return (
                "A half-precision gradient overflowed (float16 tops out at 65,504). Use "
                "torch.amp.GradScaler with a dynamic scale, compute this part in float32, or "
                "use bfloat16."
            )
        return (
            f"The gradient became non-finite in {where} while the gradient arriving there was "
            "finite: it overflowed. Clip gradients (clip_grad_norm_), lower the learning rate "
            "or the loss scale, and check for large activations feeding this layer."
        )

    if origin.phase == "loss" and (not op or (origin.kind == "inf" and op not in _LOG | _DIVIDE)):
        return (
            "The loss itself is non-finite while every model output was finite. If it is Inf, "
            "it is too large for its dtype: lower the loss scale, use mean instead of sum "
            "reduction, or compute the loss in float32."
        )
    if op in _LOG and low is not None and low <= 0:
        return (
            f"{where} got an input with minimum {low:.3g}: log of 0 is -Inf and of a negative "
            "number NaN. Add an epsilon (log(x + 1e-8)), clamp (x.clamp_min(1e-8)), or use "
            "log_softmax / logsumexp instead of log(softmax(...))."
        )
    if op in ("sqrt", "rsqrt") and low is not None and low < 0:
        return (
            f"{where} got a negative input (minimum {low:.3g}), which gives NaN. Clamp the "
            "input at 0 (x.clamp_min(0)) and add an epsilon for the gradient."
        )
    if op in _DIVIDE:
        return (
            f"{where} divided by zero (0/0 is NaN, x/0 is Inf). Add an epsilon to the "
            "denominator or mask the zero entries out before dividing."
        )
    if op in _SOFTMAX and origin.kind == "nan":
        every_inf = any(v.get("inf", 0) for v in inputs)
        return (
            f"{where} produced NaN"
            + (" from inputs containing -Inf" if every_inf else "")
            + ": a row whose entries are all masked (-Inf) has no defined softmax. Make sure "
            "every query keeps at least one unmasked key (check key_padding_mask for padded "
            "rows), or fill masks with a large finite negative number instead of -Inf."
        )
    if _half(outputs) and _max_abs(inputs) < FLOAT16_MAX and origin.kind == "inf":
        return (
            f"{where} overflowed float16 (largest finite value 65,504) although its inputs "
            "were finite; float32 would be fine. Run this part in float32, use bfloat16, or "
            "use autocast (which keeps overflow-prone ops in float32) with GradScaler."
        )
    if op in _EXP or origin.kind == "inf":
        return (
            f"{where} overflowed to Inf from finite inputs (largest |input| "
            f"{_max_abs(inputs):.3g}). Subtract the maximum before exp (logsumexp trick), clamp "
            "the input, lower the learning rate or add gradient clipping so activations stay "
            "in range."
        )
    if origin.phase == "loss":
        return (
            f"The loss computation ({where}) made the first non-finite value. Check its inputs "
            "for zeros under a log or a division and add an epsilon or clamp."
        )
    return (
        f"{where} made the first non-finite value from finite inputs. Look at the input "
        "values below for zeros, negatives or very large magnitudes; the usual remedies are an "
        "epsilon, clamping, gradient clipping or a lower learning rate."
    )


def _format_values(label: str, stats: dict[str, Any]) -> str:
    parts = [f"{label} {tuple(stats.get('shape', ()))} {stats.get('dtype', '')}"]
    if "min" in stats:
        parts.append(f"min {stats['min']:.4g} max {stats['max']:.4g} mean {stats['mean']:.4g}")
    if stats.get("nan") or stats.get("inf"):
        parts.append(f"{stats.get('nan', 0)} NaN, {stats.get('inf', 0)} Inf")
    return ", ".join(parts)


def explain(origin: Origin) -> list[str]:
    """The diagnosis as readable lines: where, the line of code, the values, the hint."""
    lines = [origin.describe()]
    values = origin.details.get("values") or {}
    labels = {
        "inputs": "input",
        "outputs": "output",
        "grad_in": "gradient arriving",
        "grad_out": "gradient leaving",
    }
    for key, label in labels.items():
        for stats in values.get(key, []):
            lines.append("  " + _format_values(label, stats))
    hint = origin.details.get("hint")
    if hint:
        lines.append("hint: " + hint)
    return lines
