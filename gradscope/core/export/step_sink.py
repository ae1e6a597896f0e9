"""What every export sink shares: a step is handed on once it is complete. With the update
ratio on, the watch fills a step's ``update_ratio`` at the next step (after its optimizer
step ran), so such a step is held until then, or until ``close()``, as the recording sink
does."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gradscope.core.facts import LayerInfo, StepStats, WatchView


class CompleteStepSink:
    """Subclasses write a complete step in :meth:`write` and release what they hold in
    :meth:`release` (called by :meth:`close`, after the last step)."""

    _held: tuple[StepStats, list[LayerInfo]] | None = None

    def on_step(self, watch: WatchView, stats: StepStats) -> None:
        self._write_held()
        if watch.update_ratio_enabled:
            self._held = (stats, list(watch.layers))
        else:
            self.write(stats, watch.layers)

    def _write_held(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self.write(*held)

    def write(self, stats: StepStats, layers: list[LayerInfo]) -> None:
        raise NotImplementedError

    def release(self) -> None:
        """Nothing to release by default."""

    def close(self) -> None:
        try:
            self._write_held()
        finally:
            self.release()
