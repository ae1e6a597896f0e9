"""What the training-library callbacks share: the watch they feed, where its recording
goes, the loss of the micro-batches an optimizer step sums, and opening the app."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn


def recording_path(record: str | os.PathLike[str] | None, folder: str | os.PathLike[str]) -> Path:
    """``record`` as given, or ``folder/gradscope.gsrec`` (``gradscope-2.gsrec``... when a
    recording of an earlier run is already there: a new run never fails on an old file)."""
    if record is not None:
        return Path(record).expanduser()
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gradscope.gsrec"
    number = 1
    while path.exists():
        number += 1
        path = folder / f"gradscope-{number}.gsrec"
    return path


class LossAccumulator:
    """The loss of one optimizer step: the sum of its micro-batches' losses, kept on the
    device (no synchronisation until the watch makes its one transfer)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.count = 0

    def add(self, loss: Any) -> None:
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        value = loss.detach().reshape(()).float()
        self.total = value if self.total is None else self.total + value
        self.count += 1

    def take(self) -> tuple[torch.Tensor | None, int]:
        """The sum of the losses added since the last call, and how many there were."""
        total, count = self.total, self.count
        self.total, self.count = None, 0
        return total, count


class CallbackViews:
    """What every GradScope callback shows of its watch (``self._gradscope``)."""

    _gradscope: CallbackWatch

    @property
    def path(self) -> Path | None:
        """Where the recording is written (None before training starts, or on a process
        that does not record)."""
        return self._gradscope.path

    @property
    def watch(self) -> Any:
        """The live watch while training runs (None otherwise)."""
        return self._gradscope.watch

    @property
    def last_stats(self) -> Any:
        """The last optimizer step's :class:`~gradscope.core.watch.StepStats`."""
        return self._gradscope.last_stats


class CallbackWatch:
    """The watch behind a callback, created when training starts (on the process that
    records) and closed when it ends."""

    def __init__(
        self,
        record: str | os.PathLike[str] | None,
        layers: str | Sequence[str] | None,
        detail_every: int | None,
        open_app: bool,
        watch_options: Mapping[str, Any],
    ) -> None:
        self.record = record
        self.layers = layers
        self.detail_every = detail_every
        self.open_app = open_app
        self.watch_options = dict(watch_options)
        self.watch: Any = None
        self.path: Path | None = None
        self.app: subprocess.Popen | None = None
        self.last_stats: Any = None

    def start(
        self,
        model: nn.Module,
        folder: str | os.PathLike[str],
        settings: dict,
        sinks: Sequence[Any] = (),
    ) -> None:
        import gradscope

        self.close()
        self.path = recording_path(self.record, folder)
        options = dict(self.watch_options)
        if sinks:
            options["sinks"] = [*options.get("sinks", ()), *sinks]
        # Passed only when given, so the watch's own default applies otherwise.
        if self.detail_every is not None:
            options["detail_every"] = self.detail_every
        # Only one process records (the global rank 0): its watch must run no collective.
        options.setdefault("collectives", False)
        self.watch = gradscope.watch(
            model, self.layers, record=self.path, settings=settings, **options
        )
        if self.open_app:
            self.app = open_app(self.path)

    def collect(self, loss: torch.Tensor | None, step: int | None, locate: Any = None) -> Any:
        """``locate``: the library's own repeat of the step (see ``_repeat.KeptSteps``)."""
        if self.watch is None:
            return None
        if step is not None:
            self.watch.step = step
        self.last_stats = self.watch.collect(loss, locate=locate)
        return self.last_stats

    def close(self) -> None:
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.close()


def open_app(path: Path) -> subprocess.Popen:
    """``gradscope open PATH`` in its own process: the app follows the recording live and
    stays open after training ends; closing it does not touch the training."""
    return subprocess.Popen(
        [sys.executable, "-m", "gradscope", "open", str(path)],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
