"""Big models: the plots can show only the top k of the ticked layers, by their gradient
norm at the last step or by their worst status so far (NaN/Inf, exploding, vanishing
first). A choice of what to show, read from the history; nothing is computed anew."""

from __future__ import annotations

import math

from gradscope.core.history import MISSING, RunHistory

TOP_K = 10
# choice -> what the selector says
LAYER_CHOICES = {
    "ticked": "All ticked layers",
    "norm": f"Top {TOP_K} by ‖grad‖",
    "status": f"Top {TOP_K} by status",
}


def top_layers(history: RunHistory, ticked: list[str], by: str, k: int = TOP_K) -> list[str]:
    """``ticked`` (in their order) cut to the ``k`` first by ``by``: "norm" (the last
    step's gradient norm, a NaN/Inf one first, layers not measured then last) or "status"
    (worst status so far, then that norm); "ticked" keeps them all."""
    if by == "ticked" or len(ticked) <= k or not history.count:
        return list(ticked)
    last = history.matrix("grad_norm")[-1]

    def norm_key(name: str) -> float:
        value = float(last[history.column(name)])
        if value == MISSING:
            return -math.inf
        return math.inf if not math.isfinite(value) else value

    if by == "norm":
        ranked = sorted(ticked, key=norm_key, reverse=True)
    elif by == "status":
        worst = history.worst_status  # status codes grow with severity (core/watch.py)
        ranked = sorted(
            ticked, key=lambda n: (int(worst[history.column(n)]), norm_key(n)), reverse=True
        )
    else:
        raise ValueError(f"no such layer choice: {by!r}")
    chosen = set(ranked[:k])
    return [name for name in ticked if name in chosen]
