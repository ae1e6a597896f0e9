"""GradScope: see where a PyTorch training run's gradients explode, vanish or turn NaN/Inf.

``import gradscope`` stays cheap (no torch import) so the app can show its window fast;
``gradscope.watch`` imports the engine on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gradscope.core.watch import GradientWatch

__all__ = ["__version__", "watch"]


def watch(model: Any, layers: Any = None, **options: Any) -> GradientWatch:
    """Watch ``model``'s gradients: call ``.collect()`` after each ``loss.backward()``.

    ``layers`` is None (every module that owns parameters) or names/glob patterns of
    ``model.named_modules()``. See :class:`gradscope.core.watch.GradientWatch` for options.
    """
    from gradscope.core.watch import GradientWatch

    return GradientWatch(model, layers=layers, **options)
