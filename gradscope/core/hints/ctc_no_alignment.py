"""Evidence: CTC's lengths and targets, per sample: a sample whose labels (plus a blank
between each pair of repeated neighbours) outnumber its input frames has no alignment, so
its loss is Inf; if every sample fits, the alignments' probability underflowed."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, evidence, where

FIX = (
    "Check input_lengths (the frames left after any downsampling) against "
    "target_lengths, drop such samples from the data, or pass zero_infinity=True to give "
    "them a zero loss and gradient."
)


def hint(origin: Origin) -> str | None:
    ctc = evidence(origin, "ctc")
    if base_op(origin.op) != "ctc_loss" or not ctc or origin.kind != "inf":
        return None
    impossible = ctc.get("impossible") or []
    too_short = [s for s in impossible if s["labels"] > s["frames"]]
    if too_short:
        sample = too_short[0]
        return (
            f"{where(origin)} is Inf because no alignment exists: sample {sample['sample']} "
            f"has {sample['labels']} target labels but only {sample['frames']} input frames "
            f"({ctc['impossible_count']} such sample(s)); CTC needs at least one frame per "
            "label. This is not an overflow. " + FIX
        )
    if impossible:
        sample = impossible[0]
        return (
            f"{where(origin)} is Inf because no alignment exists: sample {sample['sample']} "
            f"has {sample['labels']} labels in {sample['frames']} frames, but its "
            f"{sample['repeats']} repeated neighbouring label(s) each need a blank in "
            f"between, so it needs {sample['labels'] + sample['repeats']} frames. This is not "
            "an overflow. " + FIX
        )
    return (
        f"{where(origin)} is Inf although every target fits its input: the probability of "
        "every alignment underflowed (log_probs far below 0 on the target labels, or "
        "probabilities instead of log_softmax output were passed). " + FIX
    )
