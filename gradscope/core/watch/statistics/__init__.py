"""The statistics a watch measures, one module each, all by one protocol
(:class:`Statistic`, public as ``gradscope.Statistic``).

A new built-in statistic is one module here, a subclass of :class:`Statistic` that says how
to read it (one parameter at a time, or batched: from a group's large tensors by fused calls
and from a stacked batch of small ones) and how a layer's figure follows from its
parameters' (``combine``); and one line in ``BUILT_INS`` below. The reads, the placing, the
schedule and the per-layer figures then come for it: ``StepStats.figures[name]`` on the
steps it is due (the ones listed in ``FIELDS`` have a field of their own in StepStats).
Users pass theirs to ``gradscope.watch(model, statistics=[...])``; they go the same way.
"""

from gradscope.core.watch.statistics.base import COMBINES, Statistic, StatisticError
from gradscope.core.watch.statistics.grad_norm import GradNorm
from gradscope.core.watch.statistics.max_abs import MaxAbs
from gradscope.core.watch.statistics.nonfinite_counts import InfCount, NanCount
from gradscope.core.watch.statistics.update_ratio import UpdateRatio
from gradscope.core.watch.statistics.weight_norm import WeightNorm

# Every built-in statistic, in reading order (a sharded group's exchange sends the batched
# ones in this order too).
BUILT_INS: tuple[Statistic, ...] = (
    GradNorm(),
    NanCount(),
    InfCount(),
    WeightNorm(),
    MaxAbs(),
    UpdateRatio(),
)
# Those with a field of their own in StepStats (the others go to StepStats.figures).
FIELDS = frozenset(
    {"grad_norm", "nan_count", "inf_count", "weight_norm", "max_abs", "update_ratio"}
)


def by_name(name: str) -> Statistic:
    return next(s for s in BUILT_INS if s.name == name)


__all__ = [
    "BUILT_INS",
    "COMBINES",
    "FIELDS",
    "GradNorm",
    "InfCount",
    "MaxAbs",
    "NanCount",
    "Statistic",
    "StatisticError",
    "UpdateRatio",
    "WeightNorm",
    "by_name",
]
