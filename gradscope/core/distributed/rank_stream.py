"""A rank's steps, handed to the launcher one record at a time.

Each rank appends pickled ``(kind, payload)`` records to its own file and flushes after each,
so the launcher can read every finished step even when the rank is killed mid-run (a record
cut short by the kill is ignored). The launcher made the folder and starts the ranks itself:
the files are read only by it.
"""

from __future__ import annotations

import copy
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

START = "start"  # the process is up: rank, world size, pid
BUILT = "built"  # the model, watch and optimizer exist: layers, device, settings as used
STEP_STARTED = "step_started"  # the step's number (the launcher's progress signal)
STEP = "step"  # a finished step
END = "end"  # the rank ended by itself: error (None when it finished), halted


def stream_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.stream"


def stacks_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.stacks"


def output_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.out"


class RankStreamWriter:
    def __init__(self, path: Path) -> None:
        self._file = open(path, "ab", buffering=0)

    def write(self, kind: str, payload: Any) -> None:
        try:
            data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps((kind, _plain(payload)), protocol=pickle.HIGHEST_PROTOCOL)
        self._file.write(data)
        if kind == END:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def _plain(payload: Any) -> Any:
    """A payload that pickles: an origin's details and a trace may hold objects that do not
    (the user's own); those are replaced by their text."""
    from gradscope.core.report import _json_safe

    if not isinstance(payload, dict):
        return repr(payload)
    plain = dict(payload)
    origin = plain.get("origin")
    if origin is not None:
        origin = copy.copy(origin)
        origin.details = _json_safe({k: _text_if_odd(v) for k, v in origin.details.items()})
        plain["origin"] = origin
    stats = plain.get("stats")
    if stats is not None:
        stats = copy.copy(stats)
        stats.origin = plain.get("origin")
        stats.extra = {}
        plain["stats"] = stats
    plain["trace"] = None
    return plain


def _text_if_odd(value: Any) -> Any:
    try:
        pickle.dumps(value)
    except Exception:
        return repr(value)
    return value


def read_stream(path: Path) -> Iterator[tuple[str, Any]]:
    """Every complete record of ``path`` (none when the rank never started)."""
    try:
        file = open(path, "rb")
    except FileNotFoundError:
        return
    with file:
        while True:
            try:
                yield pickle.load(file)
            except (EOFError, pickle.UnpicklingError, AttributeError, ValueError, TypeError):
                return  # the end, or a record cut short by a kill
