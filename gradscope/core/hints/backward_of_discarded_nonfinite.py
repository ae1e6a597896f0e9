"""Evidence: a backward op went non-finite from a finite incoming gradient while what it
saved from the forward already held NaN: the forward made those values, and a later
``torch.where`` (or a mask) discarded them, so the forward's result stayed finite. The
gradient still flows through the discarded branch: 0 * NaN is NaN."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import holds_inf, holds_nan, values, where


def hint(origin: Origin) -> str | None:
    if origin.phase != "backward" or origin.details.get("custom_function"):
        return None
    kept = values(origin, "saved")
    # NaN only: a saved -inf is usually a mask that the op consumes on purpose
    bad = [v for v in kept if v.get("nan")]
    if not bad or holds_nan(values(origin, "grad_in")) or holds_inf(values(origin, "grad_in")):
        return None
    first = bad[0]
    count = " and ".join(
        f"{first[k]} {label}" for k, label in (("nan", "NaN"), ("inf", "Inf")) if first.get(k)
    )
    return (
        f"The gradient of {where(origin)} is non-finite because its forward already made "
        f"{count} (in its saved {first.get('name', 'values')}), which a later torch.where or "
        "mask discarded, so the forward's result was finite. The backward still goes "
        "through the discarded branch, where 0 * NaN is NaN. The usual fix is to keep the "
        "op's input inside its domain where the result is discarded (the 'double where': "
        "torch.where(ok, torch.sqrt(torch.where(ok, x, 1)), 0)); masking the output alone "
        "does not help."
    )
