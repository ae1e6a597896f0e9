"""Evidence: the op made NaN from inputs that held Inf but no NaN (recorded counts): Inf
times 0, Inf - Inf and Inf/Inf are NaN. When those Infs are all -inf among values <= 0
(a 0/-inf mask, log-probabilities), a -inf mask multiplied by 0 or summed with +inf made it."""

from __future__ import annotations

import math

from gradscope.core.facts import Origin
from gradscope.core.hints.values import holds_inf, holds_nan, values, where


def _mask_like(stats: dict) -> bool:
    return bool(stats.get("inf")) and stats.get("min") == -math.inf and stats.get("max", 1) <= 0


def hint(origin: Origin) -> str | None:
    inputs = values(origin, "inputs")
    if origin.phase == "backward" or origin.kind != "nan":
        return None
    if not holds_inf(inputs) or holds_nan(inputs):
        return None
    if any(_mask_like(v) for v in inputs):
        return (
            f"{where(origin)} turned a -inf mask into NaN: its input holds -inf among values "
            "<= 0 (a 0/-inf mask or log-probabilities), and a -inf multiplied by 0 or summed "
            "with +inf is NaN (0 * log(0) in an entropy over masked entries is the classic "
            "case). Apply the mask after this op (torch.where / masked_fill on the result), "
            "or mask with torch.finfo(dtype).min instead of -inf."
        )
    return (
        f"{where(origin)} made NaN from inputs holding Inf (no NaN): Inf * 0, Inf - Inf or "
        "Inf / Inf is NaN. The Inf itself is the first problem: GradScope names the op that "
        "made it when it saw one; here it came in from outside the traced ops."
    )
