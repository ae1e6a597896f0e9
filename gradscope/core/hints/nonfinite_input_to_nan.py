"""Evidence: the op made NaN from inputs that held Inf but no NaN (recorded counts): Inf
times 0, Inf - Inf and Inf/Inf are NaN. When those Infs are all -inf among values <= 0
(a 0/-inf mask, log-probabilities), a -inf mask multiplied by 0 or summed with +inf made it."""

from __future__ import annotations

import math

from gradscope.core.facts import Origin
from gradscope.core.hints.values import fmt, holds_inf, holds_nan, values, where


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
            "or mask with a large finite negative number (-1e9 in float32, -1e4 in half "
            "precision) instead of -inf."
        )
    carrying = [v for v in inputs if v.get("inf")]
    shown = ", ".join(
        f"{v.get('name', f'input {inputs.index(v)}')} ({v.get('inf')} Inf, min "
        f"{fmt(v.get('min', math.nan))}, max {fmt(v.get('max', math.nan))})"
        for v in carrying[:2]
    )
    return (
        f"{where(origin)} made NaN from inputs holding Inf (no NaN): {shown}; Inf * 0, "
        "Inf - Inf or Inf / Inf is NaN. The Inf itself is the first problem, and no traced "
        "op of this step made it: it came with a tensor made before the step (a buffer, a "
        "constant, a value computed outside torch). Find where that tensor is filled."
    )
