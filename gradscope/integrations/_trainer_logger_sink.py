"""``GradScopeCallback(log_to_trainer=True)`` for Lightning: the watch's statistics go to
the Trainer's own loggers (TensorBoard, W&B, CSV... whatever it has), under the export tags
(:mod:`gradscope.core.export.scalars`), at the Trainer's global step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradscope.core.export.scalars import stats_scalars
from gradscope.core.export.step_sink import CompleteStepSink

if TYPE_CHECKING:
    from gradscope.core.facts import LayerInfo, StepStats


class TrainerLoggerSink(CompleteStepSink):
    """Hands each step's scalars to ``logger.log_metrics`` of every logger of ``trainer``."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def write(self, stats: StepStats, layers: list[LayerInfo]) -> None:
        scalars = stats_scalars(stats, layers)
        for logger in self.trainer.loggers:
            logger.log_metrics(scalars, step=stats.step)

    def release(self) -> None:
        for logger in self.trainer.loggers:
            logger.save()
