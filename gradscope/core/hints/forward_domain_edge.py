"""Evidence: an op whose result is infinite at a finite point of its input made Inf there,
or NaN past it, as its input's recorded min/max show: atanh at +-1, logit at 0 or 1 (its
``eps`` argument recorded), log1p at -1 (NaN below), a negative power (an exponent among
its arguments) of 0, lgamma/digamma at their poles (0 and the negative integers). These
are the edges of the op's domain, not overflows."""

from __future__ import annotations

from typing import Any

from gradscope.core.facts import Origin
from gradscope.core.hints.values import argument, base_op, fmt, values, where


def _range(origin: Origin) -> tuple[float, float, dict[str, Any]]:
    inputs = values(origin, "inputs")
    first = inputs[0] if inputs else {}
    return first.get("min", 0.0), first.get("max", 0.0), first


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward":
        return None
    op = base_op(origin.op)
    low, high, first = _range(origin)
    if op in ("atanh", "arctanh") and origin.kind == "inf" and (low <= -1 or high >= 1):
        return (
            f"{where(origin)} reached the edge of its domain: atanh(+-1) is +-Inf, and its "
            f"input reaches {fmt(low if low <= -1 else high)}. A value computed to lie in "
            "(-1, 1) (a tanh output, a correlation) rounds to +-1: clamp it to "
            "[-1 + 1e-6, 1 - 1e-6] (in float32; wider in half precision) before atanh."
        )
    if op == "logit" and (low <= 0 or high >= 1):
        eps = argument(origin, "eps", "arg1")
        given = f"its eps argument is {eps}, " if eps is not None else "no eps was passed, "
        return (
            f"{where(origin)} got probabilities at the edge (min {fmt(low)}, max {fmt(high)}): "
            f"logit(0) = -Inf and logit(1) = +Inf, and {given}so nothing clamps them. Pass "
            "eps (torch.logit(p, eps=1e-6) clamps p to [eps, 1 - eps]): the usual fix; or "
            "keep the logits the probabilities came from and use those."
        )
    if op in ("lgamma", "digamma", "polygamma", "mvlgamma") and low <= 0:
        return (
            f"{where(origin)} has poles at 0 and at every negative integer, and its input "
            f"reaches {fmt(low)}. Its argument is meant to be > 0 (a Gamma/Beta/Dirichlet "
            "concentration, a count + 1): make it positive by construction (softplus(x) + "
            "1e-4 for a learned parameter); a clamp only hides how it got there."
        )
    if op == "log1p" and low <= -1:
        made = "-Inf at -1" if origin.kind == "inf" else "NaN below -1"
        return (
            f"{where(origin)} is log(1 + x): its input reaches {fmt(low)}, and it is {made}. "
            "x is meant to be > -1 (a rate, a relative change): find what drove it to -1; "
            "clamping (x.clamp_min(-1 + 1e-6)) only hides that."
        )
    if op in ("pow", "__pow__", "float_power") and origin.kind == "inf" and first.get("zeros"):
        exponent = argument(origin, "exponent", "arg1")
        if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and exponent < 0:
            return (
                f"{where(origin)} raised 0 to the negative power {exponent:g} ({first['zeros']} "
                f"exact zeros in its base): x ** {exponent:g} divides by x, so 0 gives Inf. "
                "Clamp the base to a small positive floor (x.clamp_min(1e-6)), or add an "
                "epsilon where the base is a measured magnitude (a norm, a count of 0 is "
                "clamped to 1 instead)."
            )
    return None
