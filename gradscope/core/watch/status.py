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
    nonfinite_count: np.ndarray | None,
    explode_threshold: float,
    vanish_threshold: float,
) -> np.ndarray:
    """Status per layer from this step's figures alone (``nonfinite_count`` None: no
    figure was NaN/Inf, nothing was counted)."""
    return classify_step(grad_norm, nonfinite_count, explode_threshold, vanish_threshold)[0]


# All-ok statuses by shape: one copy a step instead of np.full's two Python calls.
_ALL_OK: dict[tuple[int, ...], np.ndarray] = {}


def all_ok_status(layers: int) -> np.ndarray:
    """The statuses of ``layers`` layers that are all ok (shared: copy before handing out)."""
    template = _ALL_OK.get((layers,))
    if template is None:
        template = _ALL_OK[(layers,)] = np.full((layers,), STATUS_OK, np.uint8)
    return template


def classify_step(
    grad_norm: np.ndarray,
    nonfinite_count: np.ndarray | None,
    explode_threshold: float,
    vanish_threshold: float,
) -> tuple[np.ndarray, bool]:
    """:func:`classify`, and whether every layer is ok (then nothing is vanishing)."""
    template = _ALL_OK.get(grad_norm.shape)
    if template is None:
        template = _ALL_OK[grad_norm.shape] = np.full(grad_norm.shape, STATUS_OK, np.uint8)
    status = template.copy()
    if not len(status):
        return status, True
    low, high = np.minimum.reduce(grad_norm), np.maximum.reduce(grad_norm)
    if low >= vanish_threshold and high <= explode_threshold and nonfinite_count is None:
        return status, True  # every layer ok (a NaN norm fails both comparisons)
    with np.errstate(invalid="ignore"):
        status[grad_norm < vanish_threshold] = STATUS_VANISHING
        status[grad_norm > explode_threshold] = STATUS_EXPLODING
    if nonfinite_count is not None:
        status[nonfinite_count > 0] = STATUS_NONFINITE
    status[np.isnan(grad_norm)] = STATUS_NONFINITE
    return status, False


class StatusTracker:
    """What a status needs from earlier steps: vanishing is a persistent state, a layer's
    norm under the threshold for ``vanish_steps`` consecutive measured steps (a fresh model's
    gradients can be exactly 0 at its first step: timm's zero-initialised last BN scale,
    ConvNeXt's layer scale of 1e-6; that is no alarm); and the last step's statuses, since a
    step whose statuses differ gets the detail."""

    def __init__(self, vanish_steps: int = 3) -> None:
        self.vanish_steps = int(vanish_steps)
        self.previous: bytes | None = None
        # Per layer: consecutive measured steps under the vanish threshold so far.
        self._below: np.ndarray | None = None

    def persist(self, status: np.ndarray, measured: np.ndarray | None) -> None:
        """Turn this step's momentary "vanishing" into "ok" until it has lasted
        ``vanish_steps`` measured steps (in place). ``measured``: the layers that got a
        gradient this step (None: all of them); the others keep their count."""
        below = self._below
        vanishing = status == STATUS_VANISHING
        if below is None and not vanishing.any():
            return  # nothing under the threshold, now or before
        if below is None or len(below) != len(status):
            below = np.zeros(len(status), dtype=np.int64)
        below = np.where(
            vanishing, below + 1, 0 if measured is None else np.where(measured, 0, below)
        )
        self._below = below if below.any() else None
        status[vanishing & (below < self.vanish_steps)] = STATUS_OK

    @property
    def counting(self) -> bool:
        """Whether some layer has been under the threshold on the steps just before."""
        return self._below is not None

    def changed(self, statuses: bytes) -> bool:
        """Whether a step's statuses (``status.tobytes()``) differ from the last step's."""
        return statuses != self.previous

    def keep(self, statuses: bytes) -> None:
        self.previous = statuses

    def forget(self) -> None:
        """A new timeline (a rewind, a replaced watch): no status before it."""
        self.previous = None
        self._below = None
