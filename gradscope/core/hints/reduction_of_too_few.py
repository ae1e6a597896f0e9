"""Evidence: a mean/var/std reduced over as many elements as its correction subtracts, or
fewer (recorded per op: the elements reduced and the correction): the sum of 0 squared
deviations is divided by 0, so 0/0 is NaN. A std over one element with the default
Bessel correction, or a mean over an empty tensor, is this."""

from __future__ import annotations

from gradscope.core.facts import Origin
from gradscope.core.hints.values import evidence, where


def hint(origin: Origin) -> str | None:
    reduced = evidence(origin, "reduction")
    if origin.phase == "backward" or origin.kind != "nan" or not reduced:
        return None
    elements, correction = reduced["elements"], reduced["correction"]
    if elements - correction > 0:
        return None
    over = "one element" if elements == 1 else f"{elements} elements"
    return (
        f"{where(origin)} reduced over {over} with a correction of {correction}: it divides "
        f"by {elements} - {correction} = {elements - correction}, so 0/0 is NaN. The data is "
        "fine; the batch (or the dimension reduced) is too small for this statistic. Use "
        "correction=0 (unbiased=False), guard the size (if x.shape[dim] > 1), or normalise "
        "with a floor on the std (x.std() if n > 1 else 1.0)."
    )
