"""The diagnosis in words: the evidence an op's arguments show, and the readable lines.

:func:`evidence_for` records, for the one op that made a NaN/Inf, what its arguments show
beyond its tensors' values (CTC's lengths, the targets a cross-entropy counts, how many
elements a std reduced, the module's epsilon, whether GradScope's default loss ran it).
The hints built from that evidence are rules in :mod:`gradscope.core.hints`, one per file;
:func:`explain` writes the origin, its values and its hint as lines.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from typing import Any

import torch

from gradscope.core.facts import Origin
from gradscope.core.hints import hint_for
from gradscope.core.hints.values import base_op

__all__ = ["base_op", "evidence_for", "explain", "hint_for"]

_SOFTMAX = {
    "softmax",
    "scaled_dot_product_attention",
    "multi_head_attention_forward",
    "_softmax",
    "_masked_softmax",
}
_REDUCTIONS = {"mean", "nanmean", "var", "std", "var_mean", "std_mean"}


# -- evidence: what an op's arguments show, recorded with the op that made the value -------
def _ints(value: Any) -> list[int] | None:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.numel() > 100_000:
            return None
        return [int(v) for v in value.detach().reshape(-1).tolist()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    if isinstance(value, int):
        return [value]
    return None


def _ctc_evidence(args: dict[str, Any]) -> dict[str, Any]:
    """Per sample: frames, labels and the repeated neighbours that need a blank between
    them; the samples that no alignment can fit (labels + repeats > frames)."""
    targets = args.get("targets")
    input_lengths = _ints(args.get("input_lengths"))
    target_lengths = _ints(args.get("target_lengths"))
    if not isinstance(targets, torch.Tensor) or input_lengths is None or target_lengths is None:
        return {}
    rows: list[list[int]] = []
    flat = targets.detach()
    if flat.dim() == 2:
        rows = [flat[i, :length].tolist() for i, length in enumerate(target_lengths)]
    else:
        offset = 0
        for length in target_lengths:
            rows.append(flat[offset : offset + length].tolist())
            offset += length
    impossible = []
    for sample, (frames, labels) in enumerate(zip(input_lengths, rows, strict=False)):
        repeats = sum(1 for a, b in itertools.pairwise(labels) if a == b)
        if len(labels) + repeats > frames:
            impossible.append(
                {"sample": sample, "frames": frames, "labels": len(labels), "repeats": repeats}
            )
    return {
        "ctc": {
            "samples": len(rows),
            "impossible": impossible[:5],
            "impossible_count": len(impossible),
            "zero_infinity": bool(args.get("zero_infinity", False)),
            "reduction": args.get("reduction", "mean"),
        }
    }


def _cross_entropy_evidence(args: dict[str, Any]) -> dict[str, Any]:
    """How many targets count (not ``ignore_index``) and the class weight they carry: the
    denominator of a mean reduction."""
    target = args.get("target")
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        return {}
    ignore_index = int(args.get("ignore_index", -100))
    counted = target != ignore_index
    evidence: dict[str, Any] = {
        "targets": int(target.numel()),
        "counted_targets": int(counted.sum()),
        "ignore_index": ignore_index,
        "reduction": args.get("reduction", "mean"),
        "label_smoothing": float(args.get("label_smoothing", 0.0) or 0.0),
    }
    logits = args.get("input")
    if (
        isinstance(logits, torch.Tensor)
        and logits.is_floating_point()
        and logits.dim() >= 2
        and logits.shape[0] == target.shape[0]
        and logits.dim() == target.dim() + 1
    ):
        # the counted targets whose own logit is -inf: -log p(target) = -log 0
        classes = target.clamp(0, logits.shape[1] - 1).unsqueeze(1)
        at_target = logits.detach().gather(1, classes).squeeze(1)
        masked = (at_target == -math.inf) & counted
        if bool(masked.any()):
            evidence["masked_targets"] = int(masked.sum())
            rows = masked.reshape(masked.shape[0], -1).any(dim=1)
            evidence["masked_target_samples"] = torch.nonzero(rows).reshape(-1)[:5].tolist()
    weight = args.get("weight")
    if isinstance(weight, torch.Tensor) and int(counted.sum()):
        classes = target[counted].clamp(0, weight.numel() - 1)
        evidence["counted_weight"] = float(weight.detach()[classes].double().sum())
    return {"cross_entropy": evidence}


def _fully_masked(mask: Any, dim: int = -1) -> list[int] | None:
    """Indices (along the first dimension) of the rows a mask masks entirely: all True for a
    boolean mask, all -inf for an additive one."""
    if not isinstance(mask, torch.Tensor) or not mask.numel() or mask.dim() == 0:
        return None
    data = mask.detach()
    masked = data if data.dtype == torch.bool else data == -math.inf
    if not data.is_floating_point() and data.dtype != torch.bool:
        return None
    every = masked.all(dim=dim)
    if not bool(every.any()):
        return []
    if every.dim() == 0:
        return [0]
    return torch.nonzero(every.reshape(every.shape[0], -1).any(dim=1)).reshape(-1).tolist()[:10]


def _attention_evidence(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Which rows a softmax or attention op was given with every key masked."""
    found: dict[str, Any] = {}
    if name in ("softmax", "_softmax", "log_softmax"):
        scores = args.get("input", args.get("self", args.get("arg0")))
        dim = args.get("dim", args.get("arg1", -1))
        rows = _fully_masked(scores, dim if isinstance(dim, int) else -1)
        if rows:
            found["scores"] = rows
    else:
        for key in ("key_padding_mask", "attn_mask"):
            rows = _fully_masked(args.get(key))
            if rows:
                found[key] = rows
    return {"fully_masked": found} if found else {}


def _reduction_evidence(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """How many elements a mean/var/std reduced and the correction it subtracts from that
    count (Bessel's 1 for var/std unless told otherwise, 0 for a mean)."""
    source = args.get("input", args.get("self", args.get("arg0")))
    if not isinstance(source, torch.Tensor):
        return {}
    dim = args.get("dim", args.get("arg1"))
    if isinstance(dim, int):
        dim = [dim]
    if isinstance(dim, (list, tuple)) and dim and all(isinstance(d, int) for d in dim):
        elements = math.prod(source.shape[d] for d in dim)
    else:
        elements = source.numel()
    correction: Any = 0
    if name in ("var", "std", "var_mean", "std_mean"):
        correction = args.get("correction")
        unbiased = args.get("unbiased", args.get("arg2", args.get("arg1")))
        if correction is None:
            correction = 0 if unbiased is False else 1
    if not isinstance(correction, (int, float)):
        return {}
    return {"reduction": {"op": name, "elements": int(elements), "correction": correction}}


def _in_default_loss() -> bool:
    """The op runs inside GradScope's own default loss (the script has no ``loss_fn``)."""
    runner = os.path.join("gradscope", "core", "runner.py")
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "default_loss" and code.co_filename.endswith(runner):
            return True
        frame = frame.f_back
    return False


_DIVISIONS = {"div", "true_divide", "__truediv__", "divide", "__rtruediv__", "reciprocal"}
_ARGUMENTS_KEPT = 12


def _plain_arguments(args: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments that are Python numbers, booleans or strings, by name (``arg1``
    for a builtin's positional one): an exponent, ``label_smoothing``, ``reduction``,
    ``ignore_index``, ``eps``, a scalar factor. Tensors' values are recorded elsewhere."""
    found: dict[str, Any] = {}
    for key, value in args.items():
        if isinstance(value, (bool, int, float, str)) and len(found) < _ARGUMENTS_KEPT:
            found[key] = value
    return found


def _denominator_evidence(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """What a division divided by, when the recorded float tensors may not show it: a
    Python number, an integer tensor (``mask.sum()`` of a boolean mask), or a float tensor
    of whole numbers. A denominator of whole numbers >= 0 is a count: an epsilon added to it
    makes the quotient 1/eps times too large when the count is 0."""
    ordered = list(args.values())
    if name == "__rtruediv__" or name == "reciprocal":
        value = ordered[0] if ordered else None
    else:
        value = args.get("other", ordered[1] if len(ordered) > 1 else None)
    if isinstance(value, bool):
        return {}
    if isinstance(value, (int, float)):
        return {
            "denominator": {
                "source": "python number",
                "value": value,
                "zeros": int(value == 0),
                "whole": float(value).is_integer(),
            }
        }
    if not isinstance(value, torch.Tensor) or not value.numel() or value.is_complex():
        return {}
    data = value.detach()
    whole = (
        bool((data == data.round()).all()) if data.is_floating_point() else data.dtype != torch.bool
    )
    return {
        "denominator": {
            "source": "tensor",
            "dtype": str(data.dtype).replace("torch.", ""),
            "zeros": int((data == 0).sum()),
            "whole": whole and bool((data >= 0).all()),
            "min": float(data.double().min()),
        }
    }


def _autocast_dtype(args: dict[str, Any]) -> str | None:
    """The autocast dtype in force for the op's device when it ran, None outside autocast."""
    device = next((v.device.type for v in args.values() if isinstance(v, torch.Tensor)), "cpu")
    try:
        if torch.is_autocast_enabled(device):
            return str(torch.get_autocast_dtype(device)).replace("torch.", "")
    except (TypeError, RuntimeError, AttributeError):  # an older torch, an unknown device
        return None
    return None


def evidence_for(op: str, args: dict[str, Any], module: Any = None) -> dict[str, Any]:
    """What the arguments of the op that made a NaN/Inf show, beyond its tensors' values:
    CTC's lengths, how many targets a cross-entropy counts, the epsilon of the module that
    ran it, its plain (non-tensor) arguments, what a division divided by, the autocast
    dtype in force. Called by the tracer for the ops that made a NaN/Inf only."""
    name = base_op(op)
    evidence: dict[str, Any] = {}
    plain = _plain_arguments(args)
    if plain:
        evidence["arguments"] = plain
    if name in _DIVISIONS:
        evidence.update(_denominator_evidence(name, args))
    autocast = _autocast_dtype(args)
    if autocast is not None:
        evidence["autocast"] = autocast
    if name == "ctc_loss":
        evidence.update(_ctc_evidence(args))
    elif name in ("cross_entropy", "nll_loss"):
        evidence.update(_cross_entropy_evidence(args))
    elif name in _SOFTMAX or name == "log_softmax":
        evidence.update(_attention_evidence(name, args))
    elif name in _REDUCTIONS:
        evidence.update(_reduction_evidence(name, args))
    if _in_default_loss():
        evidence["default_loss"] = True
    eps = args.get("eps")
    if isinstance(eps, float):
        evidence["eps"] = eps
    if module is not None:
        for attribute in ("eps", "variance_epsilon", "epsilon"):
            value = getattr(module, attribute, None)
            if isinstance(value, float):
                evidence["module_eps"] = {
                    "module": type(module).__name__,
                    "attribute": attribute,
                    "value": value,
                }
                break
    return evidence


def _format_values(label: str, stats: dict[str, Any]) -> str:
    named = label
    if "path" in stats or "name" in stats:
        named = f"{label} {stats.get('path', stats.get('name'))}"
    parts = [f"{named} {tuple(stats.get('shape', ()))} {stats.get('dtype', '')}"]
    if "min" in stats:
        parts.append(f"min {_fmt_value(stats['min'])} max {_fmt_value(stats['max'])}")
    if "mean" in stats:
        finite = " of finite values" if stats.get("nan") or stats.get("inf") else ""
        parts.append(f"mean{finite} {stats['mean']:.4g}")
    if stats.get("nan") or stats.get("inf"):
        parts.append(f"{stats.get('nan', 0)} NaN, {stats.get('inf', 0)} Inf")
    if stats.get("zeros"):
        parts.append(f"{stats['zeros']} exact zeros")
    return ", ".join(parts)


def _fmt_value(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def explain(origin: Origin) -> list[str]:
    """The diagnosis as readable lines: where, the line of code, the values, the hint."""
    lines = [origin.describe()]
    if origin.phase == "input" and origin.details.get("positions"):
        positions = ", ".join(str(tuple(p)) for p in origin.details["positions"])
        lines.append(f"  first positions (sample index first): {positions}")
    values = origin.details.get("values") or {}
    labels = {
        "batch": "batch tensor",
        "inputs": "input",
        "outputs": "output",
        "grad_in": "gradient arriving",
        "grad_out": "gradient leaving",
        "saved": "saved from forward",
        "weights": "weight",
    }
    for key, label in labels.items():
        for stats in values.get(key, []):
            lines.append("  " + _format_values(label, stats))
    inside = origin.details.get("inside")
    if inside and inside.get("line"):
        lines.append(f"  inside: {inside['op']} at {inside['file']}:{inside['line']}")
    hint = origin.details.get("hint")
    if hint:
        lines.append("hint: " + hint)
    return lines
