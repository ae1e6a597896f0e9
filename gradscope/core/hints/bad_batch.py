"""Evidence: the batch (or the model's call arguments) already held the NaN/Inf before any
op ran (phase "input"), at the sample positions recorded."""

from __future__ import annotations

from gradscope.core.facts import Origin


def hint(origin: Origin) -> str | None:
    if origin.phase != "input":
        return None
    details = origin.details
    kind = "NaN" if origin.kind == "nan" else "Inf"
    samples = details.get("samples") or []
    at = (
        f" (sample{'s' if len(samples) > 1 else ''} "
        + ", ".join(str(s) for s in samples[:5])
        + ("..." if len(samples) > 5 else "")
        + " of the batch)"
        if samples
        else ""
    )
    given = (
        " (an argument the model was called with)" if details.get("source") == "model call" else ""
    )
    start = (
        f"The {kind} is in the batch (your data), not in the model or the loss: "
        f"{origin.tensor}{given} holds {details.get('count', '')} {kind}{at} before any "
        "layer ran. "
    )
    cause = (
        "The usual causes: a missing value or a failed parse; a division by a zero std in "
        "normalisation; a corrupt file; or an augmentation or transform that makes NaN from "
        "valid data by applying a power or a log outside its domain (a gamma x ** 0.8 or a "
        "sqrt of pixels that normalisation already made negative, a log of a value that can "
        "be <= 0). Run the sample's raw data through the transforms one at a time to see "
        "which makes it. "
        if origin.kind == "nan"
        else "An overflow while preparing it (a log of 0, a division by 0, a float16 cast of "
        "a value above 65,504, an augmentation such as an exp or a large gain) is the usual "
        "cause. "
    )
    return (
        start
        + cause
        + "Find the sample in the dataset (the positions start with the sample index), then "
        "filter or repair it there; assert torch.isfinite(x).all() in the Dataset's "
        "__getitem__ catches the next one. torch.nan_to_num only hides it, as a stopgap."
    )
