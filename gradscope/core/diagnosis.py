"""Plain-language hints: what most likely made the first NaN/Inf, and the usual remedies.

Chosen from what localisation found: the phase, the operation, the kind of value, the values
that went into it (e.g. "input min 0 into log") and what the op's arguments show (CTC's
lengths, the targets a cross-entropy counts, the module's epsilon). A hint claims only what
those recorded values show: the same op gets a different hint from different evidence.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import torch

from gradscope.core.facts import Origin

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
_EXPONENTIAL = {"exp", "exp2", "expm1", "sinh", "cosh"}
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


def _dtype(stats: list[dict[str, Any]]) -> str:
    return next((v["dtype"] for v in stats if "dtype" in v), "its dtype")


def _half(stats: list[dict[str, Any]]) -> bool:
    return any(v.get("dtype") in ("float16", "bfloat16") for v in stats)


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
    }
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


def evidence_for(op: str, args: dict[str, Any], module: Any = None) -> dict[str, Any]:
    """What the arguments of the op that made a NaN/Inf show, beyond its tensors' values:
    CTC's lengths, how many targets a cross-entropy counts, the epsilon of the module that
    ran it. Called by the tracer for that one op only."""
    name = base_op(op)
    evidence: dict[str, Any] = {}
    if name == "ctc_loss":
        evidence.update(_ctc_evidence(args))
    elif name in ("cross_entropy", "nll_loss"):
        evidence.update(_cross_entropy_evidence(args))
    elif name in _SOFTMAX or name == "log_softmax":
        evidence.update(_attention_evidence(name, args))
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


def _eps_underflow(origin: Origin) -> tuple[str, float] | None:
    """An epsilon that rounds to 0 in float16, when the op ran in float16."""
    stats = _values(origin, "inputs") + _values(origin, "outputs")
    if not any(v.get("dtype") == "float16" for v in stats):
        return None
    evidence = origin.details.get("evidence") or {}
    found = evidence.get("module_eps")
    candidates = []
    if found:
        candidates.append((f"{found['module']}.{found['attribute']}", found["value"]))
    if "eps" in evidence:
        candidates.append(("eps", evidence["eps"]))
    for label, value in candidates:
        if value > 0 and float(torch.tensor(value, dtype=torch.float16)) == 0.0:
            return label, value
    return None


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.3g}"


def _input_hint(origin: Origin) -> str:
    details = origin.details
    kind = "NaN" if origin.kind == "nan" else "Inf"
    samples = details.get("samples") or []
    where = (
        f" (sample{'s' if len(samples) > 1 else ''} "
        + ", ".join(str(s) for s in samples[:5])
        + ("..." if len(samples) > 5 else "")
        + " of the batch)"
        if samples
        else ""
    )
    if details.get("source") == "model call":
        start = (
            f"The model was called with {origin.tensor} already holding "
            f"{details.get('count', '')} {kind}{where}: the data or the code preparing it "
            "before the model is at fault, not the model. "
        )
    else:
        start = (
            f"The batch itself is bad: {origin.tensor} holds {details.get('count', '')} "
            f"{kind}{where}; the model did nothing wrong. "
        )
    cause = (
        "A missing value or a failed parse (NaN), a division by a zero std in normalisation or "
        "a corrupt file are the usual causes. "
        if origin.kind == "nan"
        else "An overflow while preparing it (a log of 0, a division by 0, a float16 cast of "
        "a value above 65,504) is the usual cause. "
    )
    inside = details.get("model_origin")
    return (
        start
        + cause
        + "Find the sample in the dataset (the positions start with the sample index), then "
        "filter or repair it there; assert torch.isfinite(x).all() in the Dataset's "
        "__getitem__ catches the next one. torch.nan_to_num only hides it, as a stopgap."
        + (f" (Where it first showed inside the model: {inside}.)" if inside else "")
    )


def _ctc_hint(origin: Origin, where: str) -> str | None:
    ctc = (origin.details.get("evidence") or {}).get("ctc")
    if not ctc or origin.kind != "inf":
        return None
    fix = (
        "Check input_lengths (the frames left after any downsampling) against "
        "target_lengths, drop such samples from the data, or pass zero_infinity=True to give "
        "them a zero loss and gradient."
    )
    impossible = ctc.get("impossible") or []
    too_short = [s for s in impossible if s["labels"] > s["frames"]]
    if too_short:
        sample = too_short[0]
        return (
            f"{where} is Inf because no alignment exists: sample {sample['sample']} has "
            f"{sample['labels']} target labels but only {sample['frames']} input frames "
            f"({ctc['impossible_count']} such sample(s)); CTC needs at least one frame per "
            "label. This is not an overflow. " + fix
        )
    if impossible:
        sample = impossible[0]
        return (
            f"{where} is Inf because no alignment exists: sample {sample['sample']} has "
            f"{sample['labels']} labels in {sample['frames']} frames, but its "
            f"{sample['repeats']} repeated neighbouring label(s) each need a blank in "
            f"between, so it needs {sample['labels'] + sample['repeats']} frames. This is not "
            "an overflow. " + fix
        )
    return (
        f"{where} is Inf although every target fits its input: the probability of every "
        "alignment underflowed (log_probs far below 0 on the target labels, or "
        "probabilities instead of log_softmax output were passed). " + fix
    )


def _cross_entropy_hint(origin: Origin, where: str) -> str | None:
    evidence = (origin.details.get("evidence") or {}).get("cross_entropy")
    if not evidence or origin.kind != "nan" or evidence.get("reduction") != "mean":
        return None
    if evidence["counted_targets"] == 0:
        return (
            f"{where} is NaN because every one of the {evidence['targets']} targets is "
            f"ignore_index ({evidence['ignore_index']}): the mean over zero counted targets is "
            "0/0. Nothing is wrong with the logits. Skip batches without a labelled target "
            "(if (target != ignore_index).any()), or use reduction='sum' divided by "
            "max(count, 1)."
        )
    if evidence.get("counted_weight") == 0.0:
        return (
            f"{where} is NaN because the class weights of all {evidence['counted_targets']} "
            "counted targets are 0: the weighted mean divides 0 by a total weight of 0. Give "
            "every class a positive weight, or skip batches whose classes all weigh 0."
        )
    return None


def _saved(origin: Origin, *names: str) -> dict[str, Any] | None:
    """What an autograd node saved from the forward, by its name (``self``, ``other``,
    ``result``)."""
    saved = _values(origin, "saved")
    for name in names:
        found = next((v for v in saved if v.get("name") == name), None)
        if found is not None:
            return found
    return None


def _backward_overflow(origin: Origin, where: str, forward: dict[str, Any]) -> str:
    """A derivative that is large but finite, times a large incoming gradient."""
    incoming = _max_abs(_values(origin, "grad_in"))
    return (
        f"The gradient of {where} overflowed: no forward value it saved is 0 (smallest "
        f"|value| {forward.get('abs_min', math.nan):.3g}), but its derivative there is large "
        f"and the gradient arriving was up to {incoming:.3g}. Scale the loss down or clip "
        "gradients, and keep the input away from tiny values (an epsilon, a clamp)."
    )


def hint_for(origin: Origin) -> str:
    op = base_op(origin.op)
    inputs = _values(origin, "inputs")
    outputs = _values(origin, "outputs")
    low = _min_input(origin)
    where = origin.op.split(" backward")[0] if origin.op else "this operation"

    if origin.phase == "input":
        return _input_hint(origin)

    if origin.phase == "update" and origin.details.get("at_start"):
        return (
            f"The weights of {origin.module or '(model)'} were already NaN/Inf at the first "
            "step GradScope saw, before any optimizer step: they were never given values, or "
            "were loaded so. A model built on the meta device (or with torch.empty) and moved "
            "with to_empty() keeps whatever the memory held unless reset_parameters() (or "
            "your init) covers every module: this one was missed. Initialise it, or check "
            "the checkpoint it was loaded from."
        )

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
        if origin.details.get("custom_function"):
            return (
                f"The backward of the custom autograd.Function {where} returned a non-finite "
                "gradient from a finite incoming one (its forward was finite). Check its "
                "backward formula: a division by a saved value that can be 0, a log or sqrt "
                "of one; torch.autograd.gradcheck on small inputs finds a wrong formula."
            )
        if op in ("sqrt", "rsqrt", "pow", "norm", "vector_norm"):
            forward = _saved(origin, "result", "self")
            if forward is None or forward.get("zeros"):
                zeros = (
                    f"; {forward['zeros']} of the values it saved from the forward are exactly 0"
                    if forward
                    else ""
                )
                return (
                    f"The derivative of {where} is infinite at 0 (d/dx sqrt(x) = 1/(2 sqrt(x)))"
                    f"{zeros}: the forward pass was finite but the gradient is not. Add a small "
                    "epsilon inside (sqrt(x + 1e-12)), clamp the input away from 0, or use a "
                    "safe norm that special-cases zero vectors."
                )
            return _backward_overflow(origin, where, forward)
        if op in _LOG or op in _DIVIDE:
            operand = _saved(origin, "other") if op in _DIVIDE else None
            operand = operand or _saved(origin, "self")
            if operand is None or operand.get("zeros"):
                zeros = f" ({operand['zeros']} exact zeros)" if operand else ""
                return (
                    f"The gradient of {where} divides by its input, which is zero here{zeros}. "
                    "Add an epsilon (log(x + eps), x / (y + eps)) or clamp the input."
                )
            return _backward_overflow(origin, where, operand)
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

    # forward and loss: what the recorded values and arguments show
    if origin.details.get("custom_function"):
        inside = origin.details.get("inside") or {}
        return (
            f"The forward of the custom autograd.Function {where} made the first non-finite "
            "value from finite inputs"
            + (f" (in its {inside['op']} at line {inside['line']})" if inside.get("line") else "")
            + ". Guard that computation (epsilon, clamp) inside the Function's forward."
        )
    if op == "ctc_loss":
        hint = _ctc_hint(origin, where)
        if hint:
            return hint
    if op in ("cross_entropy", "nll_loss"):
        hint = _cross_entropy_hint(origin, where)
        if hint:
            return hint
    if origin.details.get("propagated"):
        carried = [v for v in inputs if v.get("inf") or v.get("nan")]
        shown = carried[0] if carried else {}
        return (
            f"The loss is {origin.kind.upper()} because the values reaching {where} already "
            f"held {'-Inf' if shown.get('min') == -math.inf else 'Inf'} (min "
            f"{_fmt(shown.get('min', math.nan))}, max {_fmt(shown.get('max', math.nan))}) "
            "that no model layer made: a -inf mask or padding value reached the loss (a "
            "masked logit at the target class gives an infinite loss). Mask with a large "
            "finite negative number (torch.finfo(dtype).min) or exclude masked positions "
            "from the loss."
        )
    if origin.phase == "loss" and not op:
        return (
            "The loss is non-finite although no model output gained a NaN/Inf, and no torch "
            "operation of the loss code was seen making it (computed outside torch?). Check "
            "the loss code's inputs for zeros under a log or a division."
        )
    underflow = _eps_underflow(origin)
    if underflow is not None and (low is None or low <= 0 or origin.kind == "nan"):
        label, value = underflow
        return (
            f"{where} divided by (or took the root of) zero in float16: {label} = {value:g} "
            "rounds to 0 in float16 (its smallest positive value is 6e-8), so a row with zero "
            "variance (constant or all-zero, e.g. padding) gives 1/0. Use eps >= 1e-5 with "
            "float16, or normalise in float32 (x.float()) and cast back."
        )
    if op in _LOG and low is not None and low == 0:
        return (
            f"{where} got zeros (input minimum 0): log of 0 is -Inf. Add an epsilon "
            "(log(x + 1e-8)), clamp (x.clamp_min(1e-8)), or use log_softmax / logsumexp "
            "instead of log(softmax(...))."
        )
    if op in _LOG and low is not None and low < 0:
        return (
            f"{where} got negative inputs (minimum {_fmt(low)}): the log of a negative number "
            "is NaN, so its input is not the positive quantity the code assumes (a missing "
            "softplus/exp/ReLU, a subtraction that went below 0). Make it positive by "
            "construction; clamping only hides the sign error."
        )
    if op in ("sqrt", "rsqrt") and low is not None and low < 0:
        return (
            f"{where} got a negative input (minimum {_fmt(low)}), which gives NaN. Clamp the "
            "input at 0 (x.clamp_min(0)) and add an epsilon for the gradient."
        )
    if op in ("rsqrt", "reciprocal") and low is not None and low == 0:
        return (
            f"{where} got zeros (input minimum 0): 1/sqrt(0) and 1/0 are Inf. Add an epsilon "
            "to its input (rsqrt(var + 1e-5))."
        )
    if op in _DIVIDE:
        if origin.kind == "nan":
            return (
                f"{where} computed 0/0 (NaN): the numerator and the denominator were both "
                "zero somewhere. Add an epsilon to the denominator or mask those entries out "
                "before dividing."
            )
        return (
            f"{where} divided by zero (a non-zero value over 0 is Inf). Add an epsilon to "
            "the denominator or mask the zero entries out before dividing."
        )
    if op in _SOFTMAX and origin.kind == "nan":
        masked = (origin.details.get("evidence") or {}).get("fully_masked") or {}
        if masked:
            source, rows = next(iter(masked.items()))
            shown = ", ".join(str(r) for r in rows[:5])
            why = (
                f"some rows of its input are -Inf for every key (batch index {shown})"
                if source == "scores"
                else f"its {source} masks every key of batch index {shown}"
            )
            return (
                f"{where} produced NaN because {why}: the softmax of a row that is all -Inf "
                "is 0/0. Make sure every query keeps at least one unmasked "
                "key (an empty or fully padded sequence: check key_padding_mask for padded "
                "rows), or fill masks with a large finite negative number instead of -Inf."
            )
        if any(v.get("max") == math.inf for v in inputs):
            return (
                f"{where} produced NaN because its input holds +Inf (max inf): softmax "
                "subtracts the row maximum, and Inf - Inf is NaN. The +Inf came in from "
                "upstream, not from a mask: find where the scores overflow or are set to +Inf."
            )
        return (
            f"{where} produced NaN from inputs without NaN. Look at the input values below; "
            "a row whose entries are all -Inf (every key masked) has no defined softmax."
        )
    if _half(outputs) and _max_abs(inputs) < FLOAT16_MAX and origin.kind == "inf":
        return (
            f"{where} overflowed float16 (largest finite value 65,504) although its inputs "
            f"were finite (largest |input| {_max_abs(inputs):.3g}); float32 would be fine. Run "
            "this part in float32, use bfloat16, or use autocast (which keeps overflow-prone "
            "ops in float32) with GradScaler."
        )
    if op in _EXPONENTIAL and origin.kind == "inf":
        return (
            f"{where} overflowed to Inf: its largest input {_max_abs(inputs):.3g} is beyond "
            f"what exp can represent in {_dtype(inputs)}. Subtract the maximum before exp "
            "(logsumexp trick, torch.softmax/log_softmax do it), or clamp the input."
        )
    if origin.phase == "loss" and origin.kind == "inf":
        return (
            f"The loss computation ({where}) overflowed to Inf from finite values (largest "
            f"|input| {_max_abs(inputs):.3g}): the loss is too large for its dtype. Lower the "
            "loss scale, use mean instead of sum reduction, normalise the targets or compute "
            "the loss in float32, and look for exploding activations upstream."
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
            f"The loss computation ({where}) made the first non-finite value from inputs "
            "without NaN. Look at its input values below for zeros, negatives or extreme "
            "magnitudes."
        )
    return (
        f"{where} made the first non-finite value from finite inputs. Look at the input "
        "values below for zeros, negatives or very large magnitudes; the usual remedies are an "
        "epsilon, clamping, gradient clipping or a lower learning rate."
    )


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
