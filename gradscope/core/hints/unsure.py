"""Evidence: none that a rule explains. The hint lists what was recorded, so the user can
reason from it: the op and phase, each operand's dtype and range (which one holds NaN/Inf),
the op's plain arguments, and for a backward op the gradient arriving and what it saved.
It advises nothing."""

from __future__ import annotations

from typing import Any

from gradscope.core.facts import Origin
from gradscope.core.hints.values import evidence, fmt, holds_inf, holds_nan, values, where


def _described(label: str, stats: dict[str, Any]) -> str:
    name = label if label.startswith("saved") else (stats.get("name") or label)
    text = f"{name} {stats.get('dtype', '')}".rstrip()
    if "min" in stats:
        text += f" in [{fmt(stats['min'])}, {fmt(stats['max'])}]"
    bad = [f"{stats[k]} {label}" for k, label in (("nan", "NaN"), ("inf", "Inf")) if stats.get(k)]
    if bad:
        text += " holding " + " and ".join(bad)
    if stats.get("zeros"):
        text += f", {stats['zeros']} zeros"
    if stats.get("subnormal"):
        text += f", {stats['subnormal']} subnormal"
    return text


def _evidence_listed(origin: Origin) -> str:
    if origin.phase == "backward":
        parts = [_described("gradient arriving", v) for v in values(origin, "grad_in")[:1]]
        parts += [
            _described(f"saved {v.get('name', '')}".strip(), v) for v in values(origin, "saved")
        ]
    else:
        parts = [_described(f"input {i}", v) for i, v in enumerate(values(origin, "inputs"))]
    given = evidence(origin, "arguments") or {}
    if given:
        parts.append("arguments " + ", ".join(f"{k}={v!r}" for k, v in list(given.items())[:6]))
    return "; ".join(parts)


def hint(origin: Origin) -> str:
    inputs = values(origin, "inputs")
    kind = "NaN" if origin.kind == "nan" else "Inf"
    given = (
        "finite inputs"
        if inputs and not (holds_inf(inputs) or holds_nan(inputs))
        else "the inputs recorded below"
    )
    if origin.phase == "backward":
        given = "a finite incoming gradient"
    part = "The loss computation" if origin.phase == "loss" else where(origin)
    listed = _evidence_listed(origin)
    facts = f" What was recorded: {listed}." if listed else ""
    return (
        f"{part} ({where(origin)}) made the first {kind} from {given}.{facts} GradScope has "
        "no rule that explains it from these values; they are listed below."
        if origin.phase == "loss"
        else f"{part} made the first {kind} from {given}.{facts} GradScope has no rule that "
        "explains it from these values; they are listed below."
    )
