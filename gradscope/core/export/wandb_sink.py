"""The W&B sink: ``gradscope.watch(model, wandb=True)`` logs every collected step into the
active ``wandb.run`` with one ``wandb.log`` call holding :mod:`.scalars`' keys and
``gradscope/step`` (the watch's step). The ``gradscope/*`` keys are plotted against
``gradscope/step``, so they line up with the training steps whatever else the script logs
and however often. The first NaN/Inf origin and each early warning are text under their
tags. No per-parameter panels; no histogram upload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradscope.core.errors import GradScopeError
from gradscope.core.export.optional_import import require
from gradscope.core.export.scalars import (
    FIRST_ORIGIN_TAG,
    PREFIX,
    origin_summary,
    stats_scalars,
    warning_summary,
    warning_tag,
)
from gradscope.core.export.step_sink import CompleteStepSink

if TYPE_CHECKING:
    from gradscope.core.facts import LayerInfo, StepStats

STEP_KEY = f"{PREFIX}/step"


class WandbSink(CompleteStepSink):
    """Logs each step a watch collects into a W&B run (``run``: the active one by default)."""

    def __init__(self, run: Any = None) -> None:
        wandb = require("wandb")
        self.run = run if run is not None else wandb.run
        if self.run is None:
            raise GradScopeError(
                "wandb=True logs into the active W&B run, and there is none: call "
                "wandb.init(...) before gradscope.watch(...), or pass wandb=<the run>"
            )
        self.run.define_metric(STEP_KEY)
        self.run.define_metric(f"{PREFIX}/*", step_metric=STEP_KEY)
        self._origin_logged = False

    def write(self, stats: StepStats, layers: list[LayerInfo]) -> None:
        payload: dict[str, Any] = {STEP_KEY: stats.step, **stats_scalars(stats, layers)}
        if stats.origin is not None and not self._origin_logged:
            self._origin_logged = True
            payload[FIRST_ORIGIN_TAG] = origin_summary(stats.origin)
        for warning in stats.warnings:
            payload[warning_tag(warning)] = warning_summary(warning)
        self.run.log(payload)
