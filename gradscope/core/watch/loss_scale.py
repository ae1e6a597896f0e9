"""Mixed precision with a loss scaler (``torch.amp.GradScaler``): the figures of the true,
unscaled gradients whether or not ``scaler.unscale_`` ran (the reduced figures are divided by
the scale: no extra pass), and which non-finite steps are the scaler's own, expected overflow
(``skipped``) rather than a failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gradscope.core.facts import STATUS_NONFINITE, STATUS_SKIPPED


def scale_tensor(scaler: Any) -> torch.Tensor | None:
    """The scaler's current scale as a device tensor (read with the step's one transfer),
    or None without an enabled scaler that has scaled a loss yet."""
    if scaler is None or not scaler.is_enabled():
        return None
    return getattr(scaler, "_scale", None)


def scale_divisors(
    scaler: Any, optimizers: list[Any], params: list[torch.Tensor], scale: float
) -> tuple[np.ndarray, float]:
    """What each parameter's gradient figures are divided by: the scale, or 1 for the
    parameters of an optimizer whose gradients ``scaler.unscale_`` already divided; and the
    unwatched gradients' divisor."""
    states = getattr(scaler, "_per_optimizer_states", {})

    def unscaled(optimizer_id: int) -> bool:
        stage = states.get(optimizer_id, {}).get("stage")
        return getattr(stage, "name", "") == "UNSCALED"

    if not optimizers:  # unknown owners: the common case of one optimizer
        value = 1.0 if any(unscaled(key) for key in list(states)) else scale
        return np.full(len(params), value), value
    divisor = np.full(len(params), scale)
    index = {id(p): i for i, p in enumerate(params)}
    all_done = True
    for optimizer in optimizers:
        if not unscaled(id(optimizer)):
            all_done = False
            continue
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) in index:
                    divisor[index[id(p)]] = 1.0
    return divisor, 1.0 if all_done else scale


@dataclass
class ScaledStep:
    """What a scaled step was: ``skipped``, the scaler's own overflow (finite loss and
    batch, scaled gradients that overflowed: the scaler skips the step and halves the scale,
    as designed); ``collapsed``, a scale that fell below the threshold while its gradients
    still overflow (it never recovers: a real failure)."""

    skipped: bool
    collapsed: bool
    unwatched_nonfinite: bool


def judge_scaled_step(
    status: np.ndarray,
    *,
    scale: float,
    collapse_below: float,
    loss_nonfinite: bool,
    batch_nonfinite: bool,
    unwatched_nonfinite: bool,
) -> ScaledStep:
    """Decide ``skipped`` and ``collapsed``; the overflowed layers of a skipped step get the
    status ``skipped`` (in place). A step whose loss or batch is non-finite is a failure
    under any scaler, never skipped: the scaler would skip it at every scale."""
    overflowed = status == STATUS_NONFINITE
    overflow = bool(overflowed.any()) or unwatched_nonfinite
    collapsed = overflow and scale < collapse_below
    skipped = overflow and not loss_nonfinite and not batch_nonfinite and not collapsed
    if skipped:
        status[overflowed] = STATUS_SKIPPED
        unwatched_nonfinite = False
    return ScaledStep(skipped, collapsed, unwatched_nonfinite)
