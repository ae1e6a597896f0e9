"""The statistics a detail step reads besides the gradient norms (every ``detail_every``-th
step, and any step that goes wrong or changes a status), one module each.

A new statistic is one module here, a subclass of :class:`Statistic` that says how to read
it from a group's large tensors (fused calls) and from a stacked batch of small ones, and
how a layer's figure follows from its parameters'; and one line in ``DETAIL`` below. The
reads, the placing and the per-layer figures then come for it with every detail step:
``StepStats.figures[name]`` (the built-in ones keep their own fields, ``weight_norm`` and
``max_abs``). Sharded groups (FSDP) read the built-in ones only (gradscope.core.watch.
distributed reduces them over the ranks).
"""

from gradscope.core.watch.statistics.base import Statistic
from gradscope.core.watch.statistics.max_abs import MaxAbs
from gradscope.core.watch.statistics.weight_norm import WeightNorm

# In reading order; the sharded exchange sends the built-in ones in this order too.
DETAIL: tuple[Statistic, ...] = (WeightNorm(), MaxAbs())
# Those with a field of their own in StepStats (the rest go to StepStats.figures), in the
# order a sharded group's exchange sends them (gradscope.core.watch.distributed).
BUILT_IN = ("weight_norm", "max_abs")


def by_name(name: str) -> Statistic:
    return next(s for s in DETAIL if s.name == name)


__all__ = ["BUILT_IN", "DETAIL", "MaxAbs", "Statistic", "WeightNorm", "by_name"]
