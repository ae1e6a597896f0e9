"""||Δw||/||w|| per layer, of the optimizer step after a measured step (``watch(...,
update_ratio=True)``): the watched weights are copied before the optimizer steps and the
difference is read after it (gradscope.core.watch.update_ratio), on the weight norm's
steps."""

from __future__ import annotations

from gradscope.core.watch.statistics.base import Statistic


class UpdateRatio(Statistic):
    name = "update_ratio"
    label = "Update ratio"
    combine = "rss"
    scale_power = 0
    read_by_watch = True
    option = "update_ratio_enabled"
