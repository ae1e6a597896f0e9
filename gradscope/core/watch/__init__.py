"""The gradient watch (see :class:`GradientWatch`), one idea per module."""

from gradscope.core.facts import (
    STATUS_EXPLODING,
    STATUS_FROZEN,
    STATUS_NAMES,
    STATUS_NO_GRADIENT,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_VANISHING,
    LayerInfo,
    StepStats,
    is_flagged,
)
from gradscope.core.watch.gradient_watch import GradientWatch
from gradscope.core.watch.status import classify

__all__ = [
    "STATUS_EXPLODING",
    "STATUS_FROZEN",
    "STATUS_NAMES",
    "STATUS_NONFINITE",
    "STATUS_NO_GRADIENT",
    "STATUS_OK",
    "STATUS_SKIPPED",
    "STATUS_VANISHING",
    "GradientWatch",
    "LayerInfo",
    "StepStats",
    "classify",
    "is_flagged",
]
