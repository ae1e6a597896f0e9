"""A step's gradient norms, settled from its placed figures: the common step (every figure
finite) takes a few numpy calls; a step with a NaN/Inf, a float32 norm that may have lost
squares to underflow, an unwatched figure that overflowed, or gradients still scaled by a
loss scaler takes the closer look (gradscope.core.watch.exact, loss_scale)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradscope.core.watch.binding import Binding
from gradscope.core.watch.exact import ExactReads
from gradscope.core.watch.loss_scale import scale_divisors
from gradscope.core.watch.reads import Figures


@dataclass
class GradientNorms:
    """The step's true (unscaled) gradient norms per parameter, their squares and sums,
    and, when a figure was not finite, each parameter's NaN and Inf counts (None on the
    common step: nothing to count). ``divisor``: what the gradients were still multiplied
    by (the loss scale, per parameter; 1.0 without one)."""

    param_norm: np.ndarray
    squares: np.ndarray
    watched_sq: float
    unwatched_sq: float
    nan_per_param: np.ndarray | None = None
    inf_per_param: np.ndarray | None = None
    divisor: Any = 1.0

    @property
    def counted(self) -> bool:
        """Whether a figure was not finite (and NaN/Inf were counted)."""
        return self.nan_per_param is not None


def settle_norms(
    figures: Figures,
    binding: Binding,
    *,
    exchange: Any,
    unreduced: bool,
    scaler: Any,
    optimizers: list[Any],
) -> GradientNorms:
    """The step's gradient norms from its figures (read again exactly where they need it;
    under sharding, ``exchange`` reduces those reads unless ``unreduced``)."""
    param_norm = figures.param_norm
    unwatched_sq = figures.unwatched_sq
    # Only float64 figures can overflow a square (float32 ones end under 1e39).
    if binding.wide:
        with np.errstate(over="ignore", invalid="ignore"):
            squares = np.square(param_norm)
            watched_sq = float(np.add.reduce(squares))
    else:
        squares = np.square(param_norm)
        watched_sq = float(np.add.reduce(squares))
    # One sum says that every figure is finite (the common step): a NaN or Inf gradient
    # makes its norm NaN or Inf (its max |g| adds nothing to that); an overflowed sum of
    # finite figures only takes the closer look.
    counted = not math.isfinite(watched_sq)
    nan_per_param = inf_per_param = None
    divisor = 1.0
    if counted or figures.imprecise or figures.unwatched_bad or figures.scale is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            exact = ExactReads(binding, exchange, unreduced)
            if counted:
                suspicious = ~np.isfinite(param_norm)
                if "max_abs" in figures.per_param:
                    suspicious |= ~np.isfinite(figures.per_param["max_abs"])
                nan_per_param = np.zeros(len(param_norm), dtype=np.int64)
                inf_per_param = np.zeros(len(param_norm), dtype=np.int64)
                exact.count_nonfinite(
                    np.flatnonzero(suspicious), param_norm, nan_per_param, inf_per_param
                )
            if figures.imprecise:
                # One read for all of them (a vanishing step flags many parameters).
                flagged = np.concatenate(figures.imprecise)
                param_norm[flagged] = exact.norms(flagged)
            if figures.unwatched_bad:
                unwatched_sq += exact.unwatched_squares(figures.unwatched_bad)
            if figures.scale is not None:
                # Gradients still scaled by the loss scaler: the true ones are 1/scale.
                divisor, unwatched_divisor = scale_divisors(
                    scaler, optimizers, binding.params, figures.scale
                )
                param_norm = param_norm / divisor
                unwatched_sq = unwatched_sq / unwatched_divisor**2
            squares = np.square(param_norm)
            watched_sq = float(np.add.reduce(squares))
    return GradientNorms(
        param_norm, squares, watched_sq, unwatched_sq, nan_per_param, inf_per_param, divisor
    )
