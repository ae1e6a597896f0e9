"""A layer's status at a step, from its figures: nonfinite beats exploding beats vanishing
beats ok. The tracker keeps what a status needs from earlier steps."""

from __future__ import annotations

import numpy as np

from gradscope.core.facts import (
    STATUS_EXPLODING,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_VANISHING,
)


def classify(
    grad_norm: np.ndarray,
    nonfinite_count: np.ndarray,
    explode_threshold: float,
    vanish_threshold: float,
) -> np.ndarray:
    """Status per layer from this step's figures alone."""
    status = np.full(grad_norm.shape, STATUS_OK, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        status[grad_norm < vanish_threshold] = STATUS_VANISHING
        status[grad_norm > explode_threshold] = STATUS_EXPLODING
    status[(nonfinite_count > 0) | np.isnan(grad_norm)] = STATUS_NONFINITE
    return status


class StatusTracker:
    """The statuses of the last collected step: whether this step's differ decides whether
    a step without detail reads it (a status change always gets the detail)."""

    def __init__(self) -> None:
        self.previous: np.ndarray | None = None

    def changed(self, status: np.ndarray) -> bool:
        return self.previous is None or not np.array_equal(status, self.previous)

    def keep(self, status: np.ndarray) -> None:
        self.previous = status

    def forget(self) -> None:
        """A new timeline (a rewind, a replaced watch): no status before it."""
        self.previous = None
