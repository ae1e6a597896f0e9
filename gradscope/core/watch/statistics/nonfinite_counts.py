"""How many NaN and how many Inf elements each layer's gradients hold (a layer's: the sum of
its parameters'), on every step. Counted exactly on the steps whose gradient norms are not
finite (gradscope.core.watch.exact); 0 on every other step without a read."""

from __future__ import annotations

from gradscope.core.watch.statistics.base import Statistic


class NanCount(Statistic):
    name = "nan_count"
    label = "NaN count"
    combine = "sum"
    every = 1
    scale_power = 0
    read_by_watch = True


class InfCount(Statistic):
    name = "inf_count"
    label = "Inf count"
    combine = "sum"
    every = 1
    scale_power = 0
    read_by_watch = True
