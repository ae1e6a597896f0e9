"""Evidence: the weights were already NaN/Inf at the first step GradScope saw, before any
optimizer step ran (phase "update", ``at_start``)."""

from __future__ import annotations

from gradscope.core.facts import Origin


def hint(origin: Origin) -> str | None:
    if origin.phase != "update" or not origin.details.get("at_start"):
        return None
    return (
        f"The weights of {origin.module or '(model)'} were already NaN/Inf at the first "
        "step GradScope saw, before any optimizer step: they were never given values, or "
        "were loaded so. A model built on the meta device (or with torch.empty) and moved "
        "with to_empty() keeps whatever the memory held unless reset_parameters() (or "
        "your init) covers every module: this one was missed. Initialise it, or check "
        "the checkpoint it was loaded from."
    )
