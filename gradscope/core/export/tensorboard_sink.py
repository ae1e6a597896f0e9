"""The TensorBoard sink: ``gradscope.watch(model, tensorboard="runs/tb")`` adds one.

Every collected step becomes one event of :mod:`gradscope.core.export.scalars`' tags at the
watch's step number; the first NaN/Inf origin is also written as text. With the update ratio
on, a step is written at the next step (or at ``close()``), once its optimizer step has been
measured, as the recording sink does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gradscope.core.export.scalars import FIRST_ORIGIN_TAG, origin_summary, step_scalars
from gradscope.core.export.tensorboard_events import TensorBoardEvents
from gradscope.core.watch import STATUS_NONFINITE

if TYPE_CHECKING:
    from gradscope.core.watch import GradientWatch, LayerInfo, StepStats


def stats_scalars(stats: StepStats, layers: list[LayerInfo]) -> dict[str, float]:
    """A watch's step as scalars (the statistics the step did not measure are left out)."""
    return step_scalars(
        [layer.name for layer in layers],
        stats.total_grad_norm,
        {
            "grad_norm": stats.grad_norm,
            "max_abs": stats.max_abs,
            "weight_norm": stats.weight_norm,
            "update_ratio": stats.update_ratio,
        },
        stats.status == STATUS_NONFINITE,
    )


class TensorBoardSink:
    """Writes each step a watch collects to a TensorBoard log folder."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self.events = TensorBoardEvents(logdir)
        self._held: tuple[StepStats, list[LayerInfo]] | None = None
        self._origin_written = False

    @property
    def logdir(self) -> os.PathLike[str]:
        return self.events.logdir

    def on_step(self, watch: GradientWatch, stats: StepStats) -> None:
        self._write_held()
        if watch.update_ratio_enabled:
            self._held = (stats, list(watch.layers))
        else:
            self._write(stats, watch.layers)

    def _write_held(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._write(*held)

    def _write(self, stats: StepStats, layers: list[LayerInfo]) -> None:
        self.events.scalars(stats.step, stats_scalars(stats, layers))
        if stats.origin is not None and not self._origin_written:
            self._origin_written = True
            self.events.text(stats.step, FIRST_ORIGIN_TAG, origin_summary(stats.origin))

    def close(self) -> None:
        try:
            self._write_held()
        finally:
            self.events.close()
