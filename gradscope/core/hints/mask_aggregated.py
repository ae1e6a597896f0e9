"""Evidence: the op's inputs held only Infs that came from a by-design -inf mask
(``masked_fill(-inf)``, an additive 0/-inf mask), and the op summed or multiplied them into
an Inf (``details["from_mask"]``): label smoothing over a masked vocabulary, a matrix
product of a masked matrix."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import values, where


def hint(origin: Origin) -> str | None:
    if not origin.details.get("from_mask"):
        return None
    inputs = values(origin, "inputs")
    masked = sum(v.get("inf", 0) for v in inputs)
    sign = "+inf" if any(v.get("max") == float("inf") for v in inputs) else "-inf"
    return (
        f"{where(origin)} added up (or multiplied) values that a -inf mask had set: its input "
        f"holds {masked} masked entries (now {sign}), and a sum over them is infinite. The "
        "mask itself is fine where softmax, log_softmax or masked_fill consume it; this op "
        "is the first that should not see the masked positions. Exclude them before the sum "
        "(x.masked_fill(~keep, 0).sum(...), or sum over the kept entries only): the usual "
        "fix. A large finite mask value instead of -inf is no fix for a sum: "
        "torch.finfo(dtype).min summed twice overflows again, and any large fill shifts "
        "the sum by a huge constant."
    )
