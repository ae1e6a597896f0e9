"""Evidence: a cross-entropy/NLL went Inf and some of its counted targets (not
``ignore_index``) are classes whose own logit is -inf (recorded as ``masked_targets``, with
the samples): -log p(target) = -log 0. The mask removes a class the labels still use."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import base_op, evidence, where


def hint(origin: Origin) -> str | None:
    if origin.phase == "backward" or origin.kind != "inf":
        return None
    if base_op(origin.op) not in ("cross_entropy", "nll_loss"):
        return None
    counted = evidence(origin, "cross_entropy") or {}
    masked = counted.get("masked_targets")
    if not masked:
        return None
    samples = ", ".join(str(s) for s in counted.get("masked_target_samples", []))
    are = "is a class whose logit is" if masked == 1 else "are classes whose logit is"
    return (
        f"{where(origin)} is Inf because {masked} of its targets (sample {samples}) {are} "
        "-inf: a mask removed a class the labels still use, and "
        "-log p(target) = -log 0. The usual fix is in the data or the mask: a label outside "
        "the allowed classes is a labelling or mapping error (check the vocabulary/class "
        "map); where such labels are expected, set them to ignore_index "
        f"({counted.get('ignore_index', -100)}) so they are not counted."
    )
