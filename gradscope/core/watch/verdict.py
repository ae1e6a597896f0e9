"""What a step's norms say: each layer's gradient norm, NaN/Inf counts and status (kept
across steps by the status tracker), and the step's own flags: a non-finite loss or
unwatched gradient, a loss scaler's skipped step or collapsed scale, and whether the step
went wrong (and so gets the detail)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gradscope.core.facts import STATUS_NONFINITE
from gradscope.core.tensor_tree import float_tensors
from gradscope.core.watch.binding import Binding
from gradscope.core.watch.layers import absent_status, layer_norms_of_squares, layer_sums
from gradscope.core.watch.loss_scale import judge_scaled_step
from gradscope.core.watch.norms import GradientNorms
from gradscope.core.watch.reads import Figures
from gradscope.core.watch.status import StatusTracker, classify_step


@dataclass
class Verdict:
    """One step's per-layer figures and statuses, and its flags. ``trouble``: the loss or
    an unwatched gradient went non-finite, or the scale collapsed (decided from the
    statuses alone under sharding); ``nonfinite``: a layer's status is nonfinite."""

    grad_norm: np.ndarray
    nan_count: np.ndarray
    inf_count: np.ndarray
    status: np.ndarray
    loss_nonfinite: bool
    unwatched_nonfinite: bool
    skipped: bool
    collapsed: bool
    trouble: bool
    nonfinite: bool


def judge_step(
    figures: Figures,
    norms: GradientNorms,
    binding: Binding,
    statuses: StatusTracker,
    *,
    explode_threshold: float,
    vanish_threshold: float,
    scale_collapse_below: float,
    batch: Any,
) -> Verdict:
    """Each layer's status from its norm (a vanishing or absent layer's kept by
    ``statuses``), and the step's flags."""
    grad_norm = layer_norms_of_squares(binding, norms.squares)
    layers = len(binding.offsets)
    counted = norms.counted
    if counted:
        nan_count = layer_sums(binding, norms.nan_per_param)
        inf_count = layer_sums(binding, norms.inf_per_param)
    else:  # the common step: nothing to count
        nan_count, inf_count = np.zeros((2, layers), dtype=np.int64)
    status, all_ok = classify_step(
        grad_norm,
        nan_count + inf_count if counted else None,
        explode_threshold,
        vanish_threshold,
    )
    measured = None  # every layer got a gradient
    if figures.has_grad is not None or binding.has_empty_layers:
        with_grad = layer_sums(binding, figures.with_grad().astype(np.intp))
        measured = with_grad > 0
        without = np.flatnonzero(~measured)
        if len(without):
            status[without] = absent_status(binding, without)
    if not all_ok or statuses.counting or measured is not None:
        statuses.persist(status, measured)
    loss_value = figures.loss
    loss_nonfinite = loss_value is not None and not math.isfinite(loss_value)
    unwatched_nonfinite = not math.isfinite(norms.unwatched_sq)
    skipped = collapsed = False
    if figures.scale is not None:
        scaled = judge_scaled_step(
            status,
            scale=figures.scale,
            collapse_below=scale_collapse_below,
            loss_nonfinite=loss_nonfinite,
            batch_nonfinite=_batch_nonfinite(batch, status, unwatched_nonfinite),
            unwatched_nonfinite=unwatched_nonfinite,
        )
        skipped, collapsed = scaled.skipped, scaled.collapsed
        unwatched_nonfinite = scaled.unwatched_nonfinite
    # Decided from the statuses alone under sharding: every rank then takes the same
    # decision (the second read exchanges figures); a rank's own loss could differ.
    trouble = not binding.sharded and (loss_nonfinite or unwatched_nonfinite or collapsed)
    # A nonfinite status is never all ok: the common step looks at no status.
    nonfinite = not all_ok and bool((status == STATUS_NONFINITE).any())
    return Verdict(
        grad_norm,
        nan_count,
        inf_count,
        status,
        loss_nonfinite,
        unwatched_nonfinite,
        skipped,
        collapsed,
        trouble,
        nonfinite,
    )


def _batch_nonfinite(batch: Any, status: np.ndarray, unwatched_nonfinite: bool) -> bool:
    """Whether the step's batch holds NaN/Inf, looked at only on a step whose gradients went
    non-finite under a loss scaler (rare: one host read then): bad data is a failure, not
    the scaler's overflow."""
    if batch is None or not (unwatched_nonfinite or (status == STATUS_NONFINITE).any()):
        return False
    tensors = [t for t in float_tensors(batch) if t.numel()]
    if not tensors:
        return False
    return bool(torch.stack([~torch.isfinite(t).all() for t in tensors]).any())
