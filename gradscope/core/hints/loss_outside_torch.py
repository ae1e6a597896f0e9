"""Evidence: the loss is non-finite, no model output gained a NaN/Inf, and no torch op of
the loss code was seen making it: it was computed outside torch."""

from __future__ import annotations

from gradscope.core.facts import Origin


def hint(origin: Origin) -> str | None:
    if origin.phase != "loss" or origin.op:
        return None
    return (
        "The loss is non-finite although no model output gained a NaN/Inf, and no torch "
        "operation of the loss code was seen making it (computed outside torch?). Check "
        "the loss code's inputs for zeros under a log or a division."
    )
