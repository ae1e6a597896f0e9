"""Evidence: a softmax or attention op made NaN, and its scores (or its key_padding_mask /
attn_mask) mask every key of some rows, recorded by batch index: the softmax of a row that
is all -Inf is 0/0."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, evidence, where

SOFTMAXES = {
    "softmax",
    "scaled_dot_product_attention",
    "multi_head_attention_forward",
    "_softmax",
    "_masked_softmax",
}


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or base_op(origin.op) not in SOFTMAXES:
        return None
    masked = evidence(origin, "fully_masked") or {}
    if origin.kind != "nan" or not masked:
        return None
    source, rows = next(iter(masked.items()))
    shown = ", ".join(str(r) for r in rows[:5])
    why = (
        f"some rows of its input are -Inf for every key (batch index {shown})"
        if source == "scores"
        else f"its {source} masks every key of batch index {shown}"
    )
    return (
        f"{where(origin)} produced NaN because {why}: the softmax of a row that is all -Inf "
        "is 0/0. Usual fix: make sure every query keeps at least one unmasked key (an empty "
        "or fully padded sequence: check key_padding_mask for padded rows, drop empty "
        "sequences from the batch), or zero those rows' output afterwards. Filling the mask "
        "with a large finite negative number instead of -Inf also removes the NaN, but those "
        "rows then attend evenly to padding; only their loss weight of 0 makes that harmless."
    )
