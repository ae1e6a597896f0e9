"""What the user is looking at: a layer and a step, picked in any view and shown in all."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Selection:
    """A layer, a step, or both (None: keep the current one)."""

    layer: str | None
    step: int | None
