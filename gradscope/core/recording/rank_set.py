"""A distributed run's recordings, read as one set.

Under torch.distributed, ``gradscope.watch(model, record="runs/x.gsrec")`` writes one file per
rank: ``runs/x.rank0.gsrec`` ... ``runs/x.rank{N-1}.gsrec`` (see :mod:`.sink`). A user may
name any of them, or the common name ``runs/x.gsrec`` (which does not exist as a file): each
means the set. The set is the rank files next to it with the same run name whose recorded
``world_size`` is rank 0's (a file left over from an earlier run with more ranks is not
part of it, and is named in the notes).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import GradScopeError
from gradscope.core.history import RunHistory
from gradscope.core.rank_facts import RankFacts
from gradscope.core.recording.format import SUFFIX

_RANK_NAME = re.compile(r"^(?P<stem>.+)\.rank(?P<rank>\d+)" + re.escape(SUFFIX) + "$")


@dataclass
class RecordingSet:
    """``paths`` by rank (those found and belonging to the set); ``primary`` the file to show
    first (rank 0's, or the lowest rank found); ``world_size`` as recorded (None when the
    files do not say); ``notes`` what a reader should know (missing ranks, stray files)."""

    common: Path
    paths: dict[int, Path]
    world_size: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def primary(self) -> Path:
        return self.paths[min(self.paths)]

    @property
    def primary_rank(self) -> int:
        return min(self.paths)


def _stem(name: str) -> str:
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


def find_rank_set(path: str | os.PathLike[str]) -> RecordingSet | None:
    """The set ``path`` belongs to: ``path`` is a rank file (``x.rank1.gsrec``), or the
    common name of rank files when no such file exists itself. None for a recording of one
    process (or a path that is neither: the reader then says what is wrong with it)."""
    path = Path(path).expanduser()
    found = _RANK_NAME.match(path.name)
    if found:
        stem = found["stem"]
    elif not path.exists():
        stem = _stem(path.name)
    else:
        return None
    folder = path.parent
    candidates: dict[int, Path] = {}
    pattern = re.compile(re.escape(stem) + r"\.rank(\d+)" + re.escape(SUFFIX) + "$")
    try:
        entries = list(folder.iterdir())
    except OSError:
        return None
    for entry in entries:
        match = pattern.match(entry.name)
        if match and entry.is_file():
            candidates[int(match[1])] = entry
    if not candidates:
        return None
    return _settle(folder / f"{stem}{SUFFIX}", candidates)


def _settle(common: Path, candidates: dict[int, Path]) -> RecordingSet:
    """Keep the files of one run: those whose recorded world size is the lowest rank's. A
    file that cannot be read is left out with a note (all of them: the first one's error)."""
    from gradscope.core.recording.reader import RecordingReader

    sizes: dict[int, int | None] = {}
    notes: list[str] = []
    readable: dict[int, Path] = {}
    first_error: GradScopeError | None = None
    for rank, path in sorted(candidates.items()):
        try:
            with RecordingReader(path, snapshot=True) as reader:
                sizes[rank] = _int_or_none(reader.info.get("world_size"))
        except GradScopeError as error:
            first_error = first_error or error
            notes.append(f"{path.name} is left out: {error.message}")
            continue
        readable[rank] = path
    if not readable:
        assert first_error is not None
        raise first_error
    return _assemble(common, readable, sizes, notes)


def _assemble(
    common: Path,
    candidates: dict[int, Path],
    sizes: dict[int, int | None],
    notes: list[str],
) -> RecordingSet:
    first = min(candidates)
    world = sizes.get(first)
    paths: dict[int, Path] = {}
    for rank, path in sorted(candidates.items()):
        if world is not None and (rank >= world or sizes.get(rank) != world):
            notes.append(
                f"{path.name} is left out: it was recorded by a run of "
                f"{sizes.get(rank) or 'unknown'} process(es), not {world}"
            )
            continue
        paths[rank] = path
    if world is not None:
        missing = [rank for rank in range(world) if rank not in paths]
        if missing:
            names = ", ".join(str(rank) for rank in missing)
            notes.append(f"the recording of rank(s) {names} of {world} is missing")
    return RecordingSet(common, paths, world, notes)


def _int_or_none(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def rank_facts_of(
    rank: int, path: Path, history: RunHistory, loss_recorded: np.ndarray
) -> RankFacts:
    """What one rank's recording says of each step: its loss (None where not given) and
    whether the step went non-finite, and by what (its loss, its located origin, or its
    gradients only)."""
    from gradscope.core.facts import STATUS_NONFINITE

    facts = RankFacts(rank, path=str(path))
    count = history.count
    statuses = history.status_matrix()[:count]
    nonfinite_rows = (statuses == STATUS_NONFINITE).any(axis=1) if count else np.zeros(0, bool)
    total = history.total_grad_norm[:count]
    origin = history.first_nonfinite
    for row, step in enumerate(history.steps.tolist()):
        given = bool(loss_recorded[row]) if row < len(loss_recorded) else False
        loss = float(history.losses[row]) if given else None
        seen = bool(nonfinite_rows[row]) or not math.isfinite(float(total[row]))
        facts.note_step(
            step,
            loss,
            statistics_nonfinite=seen,
            origin=origin if origin is not None and origin.step == step else None,
        )
    return facts


@dataclass
class LoadedSet:
    """Every rank's history and facts (by rank), read once."""

    recordings: RecordingSet
    histories: dict[int, RunHistory]
    facts: list[RankFacts]
    live: bool
    # The primary (rank 0's) recording's: what ``gradscope report`` prints and writes.
    source: str = ""
    device: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    loss_recorded: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # Its early warnings; None when the run did not look for them.
    warnings: list[Any] | None = None

    @property
    def primary_history(self) -> RunHistory:
        return self.histories[self.recordings.primary_rank]


def load_rank_set(recordings: RecordingSet) -> LoadedSet:
    from gradscope.core.recording.reader import RecordingReader

    histories: dict[int, RunHistory] = {}
    facts: list[RankFacts] = []
    loaded = LoadedSet(recordings, histories, facts, live=False)
    for rank, path in sorted(recordings.paths.items()):
        with RecordingReader(path, snapshot=True) as reader:
            _, history = reader.load()
            loaded.live = loaded.live or reader.is_live()
            histories[rank] = history
            facts.append(rank_facts_of(rank, path, history, reader.loss_recorded))
            if rank == recordings.primary_rank:
                loaded.source, loaded.device = reader.source, reader.device
                loaded.settings = reader.settings
                loaded.loss_recorded = reader.loss_recorded
                loaded.warnings = history.warnings if reader.looked_for_warnings else None
    return loaded
