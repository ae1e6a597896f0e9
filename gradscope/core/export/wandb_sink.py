"""The W&B sink: ``gradscope.watch(model, wandb=True)`` logs every collected step into the
active ``wandb.run`` with one ``wandb.log`` call holding :mod:`.scalars`' keys and
``gradscope/step`` (the watch's step). The ``gradscope/*`` keys are plotted against
``gradscope/step``, so they line up with the training steps whatever else the script logs
and however often. No per-parameter panels; no histogram upload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradscope.core.errors import GradScopeError
from gradscope.core.export.optional_import import require
from gradscope.core.export.scalars import FIRST_ORIGIN_TAG, PREFIX, origin_summary
from gradscope.core.export.tensorboard_sink import stats_scalars

if TYPE_CHECKING:
    from gradscope.core.watch import GradientWatch, LayerInfo, StepStats

STEP_KEY = f"{PREFIX}/step"


class WandbSink:
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
        self._held: tuple[StepStats, list[LayerInfo]] | None = None
        self._origin_logged = False

    def on_step(self, watch: GradientWatch, stats: StepStats) -> None:
        self._log_held()
        if watch.update_ratio_enabled:
            self._held = (stats, list(watch.layers))
        else:
            self._log(stats, watch.layers)

    def _log_held(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._log(*held)

    def _log(self, stats: StepStats, layers: list[LayerInfo]) -> None:
        payload: dict[str, Any] = {STEP_KEY: stats.step, **stats_scalars(stats, layers)}
        if stats.origin is not None and not self._origin_logged:
            self._origin_logged = True
            payload[FIRST_ORIGIN_TAG] = origin_summary(stats.origin)
        self.run.log(payload)

    def close(self) -> None:
        self._log_held()
