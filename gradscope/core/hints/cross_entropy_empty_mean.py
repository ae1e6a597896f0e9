"""Evidence: a mean-reduced cross-entropy/NLL whose counted targets (not ``ignore_index``)
number 0, or whose counted targets' class weights sum to 0: the mean is 0/0."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, evidence, where


def hint(origin: Origin) -> str | None:
    counted = evidence(origin, "cross_entropy")
    if base_op(origin.op) not in ("cross_entropy", "nll_loss") or not counted:
        return None
    if origin.kind != "nan" or counted.get("reduction") != "mean":
        return None
    if counted["counted_targets"] == 0:
        return (
            f"{where(origin)} is NaN because every one of the {counted['targets']} targets is "
            f"ignore_index ({counted['ignore_index']}): with reduction='mean' the mean over "
            "zero counted targets is 0/0. Nothing is wrong with the logits. Skip batches "
            "without a labelled target (if (target != ignore_index).any()), or use "
            "reduction='sum' divided by max(count, 1)."
        )
    if counted.get("counted_weight") == 0.0:
        return (
            f"{where(origin)} is NaN because the class weights of all "
            f"{counted['counted_targets']} counted targets are 0: the weighted mean divides 0 "
            "by a total weight of 0. Give every class a positive weight, or skip batches whose "
            "classes all weigh 0."
        )
    return None
