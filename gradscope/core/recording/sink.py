"""The recording sink: what ``gradscope.watch(model, record=...)`` adds to a watch.

The watch computes each step's statistics, events and origin; this sink only writes them.
Choosing the file is the part that must never crash a user's script: a second run with the
same ``record=`` path gets a new numbered name and a warning (unless ``overwrite=True``), a
missing folder is created, and an unwritable one is a :class:`GradScopeError` naming the
path. Under torch.distributed, when every rank watches, each rank writes its own file
(``x.rank0.gsrec``, ``x.rank1.gsrec``, ...).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gradscope.core.errors import GradScopeError
from gradscope.core.facts import Origin, StepStats, WatchView
from gradscope.core.module_tree import build_module_tree
from gradscope.core.recording.format import SUFFIX
from gradscope.core.recording.writer import RecordingWriter
from gradscope.core.user_warnings import warn_user


def _distributed_rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def rank_path(path: Path, rank: int) -> Path:
    """``runs/x.gsrec`` -> ``runs/x.rank3.gsrec``."""
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    return path.with_name(f"{stem}.rank{rank}{SUFFIX}")


def _numbered(path: Path, number: int) -> Path:
    if number == 0:
        return path
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    return path.with_name(f"{stem}-{number}{SUFFIX}")


def _taken(path: Path) -> bool:
    return path.exists()


def choose_recording_path(
    path: str | os.PathLike[str], *, overwrite: bool, per_rank: bool = True
) -> Path:
    """The file this process records to: ``path`` (per rank under torch.distributed), or the
    first free numbered name next to it when it exists and ``overwrite`` is off.

    No collective is run (a watch made on one rank only must not wait for the others):
    each rank looks at its own file, so ranks that ran together before pick the same
    number."""
    base = Path(path).expanduser()
    rank, world = _distributed_rank() if per_rank else (0, 1)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GradScopeError(
            f"cannot write a recording at {base}: cannot create the folder {base.parent} "
            f"({error.strerror or error})"
        ) from None
    if not os.access(base.parent, os.W_OK):
        raise GradScopeError(
            f"cannot write a recording at {base}: the folder {base.parent} is not writable"
        )

    def mine(number: int) -> Path:
        chosen = _numbered(base, number)
        return rank_path(chosen, rank) if world > 1 else chosen

    number = 0
    if not overwrite:
        while _taken(mine(number)):
            number += 1
    chosen = mine(number)
    if number:
        warn_user(
            f"gradscope: {mine(0)} already exists; recording to {chosen} instead "
            "(pass overwrite=True to replace it)"
        )
    return chosen


def _default_source(model: torch.nn.Module) -> str:
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if script and os.path.isfile(script):
        return os.path.abspath(script)
    return type(model).__name__


class RecordingSink:
    """Writes every step a watch collects to a recording (see :mod:`.writer`).

    The module tree, the watched layers and ``settings`` are stored at once; each step is
    queued for the background writer; ``close()`` (or the interpreter exiting) flushes it.
    With ``update_ratio`` on, a step is written at the next step (or at ``close()``), once
    its optimizer step has been measured.
    """

    def __init__(
        self,
        watch: WatchView,
        path: str | os.PathLike[str],
        settings: Mapping[str, Any] | None = None,
        *,
        overwrite: bool = False,
        commit_seconds: float = 1.0,
    ) -> None:
        model = watch.model
        first = next(iter(model.parameters()), None)
        # One file per rank when every rank watches; a watch on one rank only (a callback
        # on the global rank 0) writes the plain name.
        per_rank = watch.on_every_rank
        rank, world = _distributed_rank() if per_rank else (0, 1)
        info = {
            "source": (settings or {}).get("source") or _default_source(model),
            "device": str(first.device) if first is not None else "cpu",
            "model": type(model).__name__,
        }
        if world > 1:
            info.update(rank=str(rank), world_size=str(world))
        # Tells a reader that no stored warning means none given, not none looked for.
        if getattr(watch, "early_warnings", None) is not None:
            info["early_warnings"] = "1"
        self.writer = RecordingWriter(
            choose_recording_path(path, overwrite=overwrite, per_rank=per_rank),
            build_module_tree(model),
            settings,
            overwrite=overwrite,
            commit_seconds=commit_seconds,
            info=info,
        )
        self._held: tuple[StepStats, Any, Origin | None] | None = None
        self._described = False
        # A model on the meta device (deferred init) gets its real device at to_empty().
        self._device = info["device"]
        # At exit, also write a step still held for its update ratio; a weak reference, so
        # a forgotten watch does not keep its model alive.
        self._exit_hook = functools.partial(_close_sink, weakref.ref(self))
        atexit.register(self._exit_hook)

    @property
    def path(self) -> Path:
        return self.writer.path

    def on_step(self, watch: WatchView, stats: StepStats) -> None:
        if self._device == "meta":
            first = next(iter(watch.model.parameters()), None)
            if first is not None and first.device.type != "meta":
                self._device = str(first.device)
                self.writer.set_info("device", self._device)
        if not self._described:
            # Labels and schedules of the watch's statistics, by name (a watch that names
            # none: its statistics are stored by the names they come with).
            self._described = True
            self.writer.describe_statistics(getattr(watch, "statistic_infos", None) or ())
        if self._held is not None:
            self.writer.append(*self._held[:2], origin=self._held[2])
            self._held = None
        if watch.update_ratio_enabled:
            self._held = (stats, watch.layers, stats.origin)
        else:
            self.writer.append(stats, watch.layers, origin=stats.origin)

    def close(self) -> None:
        """Write what is left; a recording that stopped (a full disk, say) was warned about
        when it stopped and is no error here: closing a watch never breaks the user's
        script (what it does next, saving a checkpoint, must run)."""
        atexit.unregister(self._exit_hook)
        try:
            if self._held is not None:
                self.writer.append(*self._held[:2], origin=self._held[2])
                self._held = None
        finally:
            try:
                self.writer.close()
            except GradScopeError:
                if self.writer.stopped is None:
                    raise


def _close_sink(reference: weakref.ref[RecordingSink]) -> None:
    sink = reference()
    if sink is not None:
        sink.close()
