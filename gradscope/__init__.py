"""GradScope: see where a PyTorch training run's gradients explode, vanish or turn NaN/Inf.

``import gradscope`` stays cheap (no torch import) so the app can show its window fast;
``gradscope.watch`` imports the engine on first use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gradscope.core.watch import GradientWatch

__all__ = ["__version__", "watch"]


def watch(
    model: Any,
    layers: Any = None,
    *,
    record: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
    **options: Any,
) -> GradientWatch:
    """Watch ``model``'s gradients: call ``.collect()`` after each ``loss.backward()``.

    ``layers`` is None (every module that owns parameters) or names/glob patterns of
    ``model.named_modules()``. See :class:`gradscope.core.watch.GradientWatch` for options.

    ``record="runs/exp1.gsrec"`` also writes every collected step to that recording file
    (with ``settings``, an optional JSON-able dict, stored alongside; ``overwrite=True``
    replaces an existing recording): see :class:`gradscope.core.recording.RecordingWatch`.
    Call ``.close()`` at the end (or use ``with``) so the last steps are flushed.
    """
    if record is None:
        if settings is not None:
            from gradscope.core.errors import GradScopeError

            raise GradScopeError("settings= is stored in a recording; pass record= too")
        from gradscope.core.watch import GradientWatch

        return GradientWatch(model, layers=layers, **options)
    from gradscope.core.recording import RecordingWatch

    return RecordingWatch(model, layers, record=record, settings=settings, **options)
