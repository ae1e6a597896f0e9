"""Recording from any training loop: the sink that a watch feeds."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradscope.core.module_tree import build_module_tree
from gradscope.core.origin import Origin, locate_first_nonfinite, origin_from_statistics
from gradscope.core.recording.writer import RecordingWriter
from gradscope.core.watch import (
    STATUS_NONFINITE,
    GradientWatch,
    StepStats,
)


def _default_source(model: nn.Module) -> str:
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if script and os.path.isfile(script):
        return os.path.abspath(script)
    return type(model).__name__


# -- recording from any training loop -----------------------------------------------------
class RecordingWatch(GradientWatch):
    """A :class:`GradientWatch` that also writes every collected step to a recording.

    ``gradscope.watch(model, record="runs/exp1.gsrec", settings={...})`` makes one. The
    module tree, the watched layers and ``settings`` are stored at once; each ``collect()``
    queues the step for the background writer; ``close()`` (or leaving a ``with`` block, or
    the interpreter exiting) flushes it.

    The first step with a NaN/Inf gets an origin. Pass ``locate``, a function that rebuilds
    the same loss from the same batch (``lambda: loss_fn(model(x), y)``), to ``collect`` and
    that step is re-run with instruments to find the operation and line (as ``gradscope
    run`` does; random layers such as dropout draw new numbers in the re-run). Without it
    the origin says only what the statistics show: the loss or the layers that went
    non-finite.

    With ``update_ratio=True`` a step is written at the next ``collect()`` (or ``close()``),
    once its optimizer step has been measured. ``commit_seconds``: how often the writer
    commits (at most that much is lost if the process is killed).

    Steps are recorded where the statistics are made (``resolve``), so callers of the
    split ``launch()``/``resolve()`` API are recorded too.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: str | Sequence[str] | None = None,
        *,
        record: str | os.PathLike[str],
        settings: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        commit_seconds: float = 1.0,
        **options: Any,
    ) -> None:
        super().__init__(model, layers, **options)
        first = next(iter(model.parameters()), None)
        info = {
            "source": (settings or {}).get("source") or _default_source(model),
            "device": str(first.device) if first is not None else "cpu",
            "model": type(model).__name__,
        }
        try:
            self.recording = RecordingWriter(
                record,
                build_module_tree(model),
                settings,
                overwrite=overwrite,
                commit_seconds=commit_seconds,
                info=info,
            )
        except BaseException:
            super().close()
            raise
        self._held: tuple[StepStats, Origin | None] | None = None
        self._origin_found = False
        self._locate: Callable[[], torch.Tensor] | None = None
        self._last_recorded: StepStats | None = None
        # At exit, also write a step still held for its update ratio; a weak reference, so
        # a forgotten watch does not keep its model alive.
        self._exit_hook = functools.partial(_close_watch, weakref.ref(self))
        atexit.register(self._exit_hook)

    @property
    def path(self) -> Path:
        return self.recording.path

    def resolve(self, transfers: list) -> StepStats:
        stats = super().resolve(transfers)
        self._record(stats, self._locate)
        return stats

    def collect(
        self,
        loss: torch.Tensor | None = None,
        *,
        locate: Callable[[], torch.Tensor] | None = None,
    ) -> StepStats:
        """The step's statistics, as :meth:`GradientWatch.collect`, also recorded.
        ``locate``: see the class docstring."""
        self._locate = locate
        try:
            stats = super().collect(loss)
        finally:
            self._locate = None
        if stats is not self._last_recorded:  # should collect() ever bypass resolve()
            self._record(stats, locate)
        return stats

    def _record(self, stats: StepStats, locate: Callable[[], torch.Tensor] | None) -> None:
        self._last_recorded = stats
        if self._held is not None:
            self._send(*self._held)
            self._held = None
        origin = None
        if stats.nonfinite and not self._origin_found:
            self._origin_found = True
            origin = self._find_origin(stats, locate)
        if self.update_ratio_enabled:
            self._held = (stats, origin)
        else:
            self._send(stats, origin)

    def _send(self, stats: StepStats, origin: Origin | None) -> None:
        self.recording.append(stats, self.layers, origin=origin)

    def _find_origin(self, stats: StepStats, locate: Callable[[], torch.Tensor] | None) -> Origin:
        if locate is not None:
            with torch.enable_grad():
                found = locate_first_nonfinite(self.model, locate, stats.step)
            if found is not None:
                return found
        hint = (
            "found from the statistics alone; pass locate=<a function recomputing the loss "
            "from the same batch> to collect() to find the operation and line"
        )
        origin = origin_from_statistics(stats, {"hint": hint})
        if origin.phase == "backward":
            bad = [
                layer.name
                for layer, status in zip(self.layers, stats.status.tolist(), strict=True)
                if status == STATUS_NONFINITE
            ]
            origin.details["nonfinite_layers"] = bad
            # Gradients flow from the last layer to the first: the last one registered is
            # the likeliest to have gone non-finite first.
            origin.module = bad[-1] if bad else None
        return origin

    def close(self) -> None:
        atexit.unregister(self._exit_hook)
        try:
            if self._held is not None:
                self._send(*self._held)
                self._held = None
            self.recording.close()
        finally:
            super().close()


def _close_watch(reference: weakref.ref[RecordingWatch]) -> None:
    watch = reference()
    if watch is not None:
        watch.close()
