"""Evidence: none that a rule explains. The hint says what the recorded values show (the
kind, the phase, the op, that its inputs were finite) and stops there."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import holds_inf, holds_nan, values, where


def hint(origin: Origin) -> str:
    inputs = values(origin, "inputs")
    kind = "NaN" if origin.kind == "nan" else "Inf"
    given = (
        "finite inputs"
        if inputs and not (holds_inf(inputs) or holds_nan(inputs))
        else "the inputs recorded below"
    )
    part = "The loss computation" if origin.phase == "loss" else where(origin)
    return (
        f"{part} ({where(origin)}) made the first {kind} from {given}. GradScope has no rule "
        "that explains it from these values; they are listed below."
        if origin.phase == "loss"
        else f"{part} made the first {kind} from {given}. GradScope has no rule that explains "
        "it from these values; they are listed below."
    )
