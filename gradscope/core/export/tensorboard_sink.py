"""The TensorBoard sink: ``gradscope.watch(model, tensorboard="runs/tb")`` adds one.

Every collected step becomes one event of :mod:`gradscope.core.export.scalars`' tags at the
watch's step number; the first NaN/Inf origin and each early warning are also written as
text. With the update ratio
on, a step is written at the next step (or at ``close()``), once its optimizer step has been
measured, as the recording sink does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gradscope.core.export.scalars import (
    FIRST_ORIGIN_TAG,
    origin_summary,
    stats_scalars,
    warning_summary,
    warning_tag,
)
from gradscope.core.export.step_sink import CompleteStepSink
from gradscope.core.export.tensorboard_events import TensorBoardEvents

if TYPE_CHECKING:
    from gradscope.core.facts import LayerInfo, StepStats


class TensorBoardSink(CompleteStepSink):
    """Writes each step a watch collects to a TensorBoard log folder."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self.events = TensorBoardEvents(logdir)
        self._origin_written = False

    @property
    def logdir(self) -> os.PathLike[str]:
        return self.events.logdir

    def write(self, stats: StepStats, layers: list[LayerInfo]) -> None:
        self.events.scalars(stats.step, stats_scalars(stats, layers))
        if stats.origin is not None and not self._origin_written:
            self._origin_written = True
            self.events.text(stats.step, FIRST_ORIGIN_TAG, origin_summary(stats.origin))
        for warning in stats.warnings:
            self.events.text(stats.step, warning_tag(warning), warning_summary(warning))

    def release(self) -> None:
        self.events.close()
