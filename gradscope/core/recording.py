"""Recordings: a training run's statistics in one SQLite file, written while training runs
and readable (by another process too) while it is being written.

Format (``FORMAT_VERSION`` in the ``meta`` table; a reader refuses newer versions):

- ``meta``: format name and version, creation time, GradScope version, source, device, the
  caller's run settings (JSON), whether the writer finished, and the worst status seen per
  layer (a uint8 BLOB, so a decimated load still knows every layer's worst step);
- ``tree``: the module tree rows (``ModuleTree.rows()``), so no model is needed to show it;
- ``layers`` (watched layers: name, type, parameter count) and ``layer_sets`` (the layers
  each step covers, an int32 BLOB of layer positions; a new set when the watched layers
  change during a run);
- ``steps``: one row per recorded step (step number, layer set, loss, total grad norm, flags)
  and one table per statistic (``grad_norm``, ``max_abs``, ``weight_norm``, ``update_ratio``,
  ``status``) holding one BLOB per step: the step's values for its layer set as packed
  little-endian float32 (uint8 for status). NaN/Inf are stored as they are. Tables apart let
  a reader fetch one statistic without touching the others. NaN/Inf counts are sparse
  (``nonfinite_counts``, int64, only steps that have any);
- ``events`` (status onsets, the NaN/Inf origin, gaps) and ``origins`` (the first non-finite
  origin's full details as JSON);
- ``rewinds``: where the app rewound the run (``RecordingWriter.rewind_to``); the abandoned
  branch's rows are deleted, so step numbers never decrease from row to row, and a
  follower rewinds its history when it sees a new entry.

Nothing is pickled: opening a recording runs no code. SQLite's WAL mode lets readers read
while the writer appends and a committed transaction survives the writer being killed
(``synchronous=NORMAL``: an application crash loses nothing committed; a power cut may lose
the last commits, never the file's consistency).

Writing (:class:`RecordingWriter`): the training thread only appends the step's
:class:`~gradscope.core.watch.StepStats` to a bounded queue (a deque: no lock, no wake-up,
under a microsecond); a background thread sleeps until a commit is due, then packs the
batch and commits it, about once a second or every ``commit_steps`` steps, whichever comes
first. Waking once per commit rather than once per step matters: each time the writer
thread takes the GIL it can stall the training thread. When the queue is full (the disk
has fallen ``max_pending`` steps behind), the step is dropped from the recording rather
than stalling training, counted in :attr:`RecordingWriter.dropped`, warned about once, and
the recording gets a ``gap`` event naming the missing steps. The one exception is the step
that carries the first NaN/Inf origin: it waits (up to 5 s) for room, because it is the
step a user opens the recording for. Measured at 500 layers (``benchmarks/recording.py``):
under 1 us per step on the training thread, about 70 us of writer-thread CPU per step,
about 6.7 kB of file per step.

One writer per file: the writer holds a lock row (process id, host, random token, heartbeat
refreshed every ~2 s by the writer thread, also when no steps arrive). A second writer gets
a :class:`~gradscope.core.errors.GradScopeError` naming the process that writes. A lock is
stale, and may be taken over, when its process no longer exists (same host; this is how a
SIGKILLed writer's file becomes writable again at once) or its heartbeat is older than
``STALE_SECONDS`` (a writer on another host, a reused process id, a frozen process). The
check-and-claim happens in one ``BEGIN IMMEDIATE`` transaction, and every commit first
checks that the lock still carries the writer's token, so a writer that was taken over
stops instead of interleaving steps.

Reading (:class:`RecordingReader`): ``load()`` returns the module tree and a
:class:`~gradscope.core.history.RunHistory`, optionally decimated (every k-th step plus every
step with an event); ``read_new_steps(history)`` appends what was committed since the last
read (follow mode); ``read_statistic()`` reads one statistic over a range of steps at full
resolution. Reads run in short read transactions, which never block the writer.
"""

from __future__ import annotations

import atexit
import csv
import dataclasses
import functools
import io
import itertools
import json
import math
import os
import socket
import sqlite3
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch
from torch import nn

from gradscope.core.errors import GradScopeError
from gradscope.core.history import (
    MISSING,
    STATISTICS,
    STATUS_MISSING,
    Event,
    RunHistory,
    _to_float32,
    status_onsets,
)
from gradscope.core.module_tree import ModuleTree, build_module_tree
from gradscope.core.origin import Origin, locate_first_nonfinite, origin_from_statistics
from gradscope.core.watch import (
    STATUS_NAMES,
    STATUS_NONFINITE,
    STATUS_OK,
    GradientWatch,
    LayerInfo,
    StepStats,
)

FORMAT_NAME = "gradscope-recording"
FORMAT_VERSION = 1
SUFFIX = ".gsrec"
STALE_SECONDS = 30.0
HEARTBEAT_SECONDS = 2.0
ORIGIN_WAIT_SECONDS = 5.0

_SQLITE_MAGIC = b"SQLite format 3\x00"
_FLAG_LOSS_GIVEN = 1
_FLAG_LOSS_NONFINITE = 2
_FLAG_UNWATCHED_NONFINITE = 4
_VALUE_TABLES = ("grad_norm", "max_abs", "weight_norm", "update_ratio")
_DENSE_TABLES = ("grad_norm", "max_abs", "weight_norm", "status")

_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value);
CREATE TABLE writer_lock(
    id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER, host TEXT, token TEXT, heartbeat REAL);
CREATE TABLE tree(
    position INTEGER PRIMARY KEY, name TEXT NOT NULL, type TEXT NOT NULL,
    own_params INTEGER NOT NULL, total_params INTEGER NOT NULL);
CREATE TABLE layers(
    position INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, type TEXT NOT NULL,
    params INTEGER NOT NULL);
CREATE TABLE layer_sets(id INTEGER PRIMARY KEY, positions BLOB NOT NULL);
CREATE TABLE steps(
    row INTEGER PRIMARY KEY, step INTEGER NOT NULL, layer_set INTEGER NOT NULL,
    loss REAL, total_grad_norm REAL, flags INTEGER NOT NULL);
CREATE TABLE grad_norm(row INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE max_abs(row INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE weight_norm(row INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE update_ratio(row INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE status(row INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE nonfinite_counts(row INTEGER PRIMARY KEY, nan BLOB NOT NULL, inf BLOB NOT NULL);
CREATE TABLE events(
    id INTEGER PRIMARY KEY, row INTEGER NOT NULL, step INTEGER NOT NULL, kind TEXT NOT NULL,
    layer TEXT, message TEXT NOT NULL);
CREATE INDEX events_by_row ON events(row);
CREATE TABLE origins(id INTEGER PRIMARY KEY, row INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE rewinds(id INTEGER PRIMARY KEY, step INTEGER NOT NULL, row INTEGER NOT NULL);
"""
_TABLES = (
    "meta",
    "writer_lock",
    "tree",
    "layers",
    "layer_sets",
    "steps",
    "grad_norm",
    "max_abs",
    "weight_norm",
    "update_ratio",
    "status",
    "nonfinite_counts",
    "events",
    "origins",
    "rewinds",
)
_ROW_TABLES = (
    "steps",
    "grad_norm",
    "max_abs",
    "weight_norm",
    "update_ratio",
    "status",
    "nonfinite_counts",
    "events",
    "origins",
)


# -- locking ------------------------------------------------------------------------------
def _process_exists(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_is_held(pid: int | None, host: str | None, heartbeat: float | None) -> bool:
    if pid is None or heartbeat is None:
        return False
    if time.time() - heartbeat > STALE_SECONDS:
        return False
    if host == socket.gethostname():
        return _process_exists(int(pid))
    return True


def _describe_writer(pid: int, host: str) -> str:
    here = host == socket.gethostname()
    return f"process {pid}" + ("" if here else f" on {host}")


# -- the file -----------------------------------------------------------------------------
def _connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    if read_only:
        uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro"
        connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA query_only = 1")
    else:
        connection = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA busy_timeout = 5000")
    return connection


def _check_header(path: Path) -> None:
    """Tell "not a recording" and "truncated" apart before SQLite gets to say "malformed"."""
    if not path.exists():
        raise GradScopeError(f"no such recording: {path}")
    if path.is_dir():
        raise GradScopeError(f"{path} is a folder, not a recording")
    size = path.stat().st_size
    with open(path, "rb") as file:
        header = file.read(100)
    if not header.startswith(_SQLITE_MAGIC):
        raise GradScopeError(f"{path} is not a GradScope recording")
    if len(header) < 100:
        raise GradScopeError(f"{path} is damaged: it is truncated ({size} bytes)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    counter_valid = header[24:28] == header[92:96]
    wal = Path(str(path) + "-wal")
    wal_has_frames = wal.exists() and wal.stat().st_size > 32
    # In WAL mode the header's size is as of the last checkpoint, and an interrupted
    # checkpoint may leave the file short with the WAL still holding the pages.
    if pages and counter_valid and not wal_has_frames and size < pages * page_size:
        raise GradScopeError(
            f"{path} is damaged: it is truncated ({size:,} of {pages * page_size:,} bytes)"
        )


def _damaged(path: Path, error: Exception) -> GradScopeError:
    return GradScopeError(
        f"{path} is damaged (truncated or corrupt): {error}; "
        "steps up to the damage may be readable by an older copy"
    )


def _read_meta(connection: sqlite3.Connection, path: Path) -> dict[str, Any]:
    try:
        tables = {
            name
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if "meta" not in tables:
            raise GradScopeError(
                f"{path} is not a GradScope recording (an SQLite database without GradScope's "
                "tables)"
            )
        meta = dict(connection.execute("SELECT key, value FROM meta"))
    except sqlite3.DatabaseError as error:
        if "not a database" in str(error) or "file is encrypted" in str(error):
            raise GradScopeError(f"{path} is not a GradScope recording") from None
        raise _damaged(path, error) from None
    if meta.get("format") != FORMAT_NAME:
        raise GradScopeError(f"{path} is not a GradScope recording")
    version = meta.get("format_version")
    if not isinstance(version, int):
        raise _damaged(path, ValueError("no format version"))
    if version > FORMAT_VERSION:
        raise GradScopeError(
            f"{path} was written by a newer GradScope (recording format {version}; this "
            f"GradScope reads up to format {FORMAT_VERSION}); update GradScope to open it"
        )
    missing = [t for t in _TABLES if t not in tables]
    if missing:
        raise _damaged(path, ValueError(f"missing tables {', '.join(missing)}"))
    return meta


def _default_source(model: nn.Module) -> str:
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if script and os.path.isfile(script):
        return os.path.abspath(script)
    return type(model).__name__


# -- writing ------------------------------------------------------------------------------
_STOP = object()


@dataclasses.dataclass(frozen=True)
class _Rewind:
    step: int


class _Batch:
    """Rows packed by the writer thread, waiting for the next commit."""

    def __init__(self) -> None:
        self.layers: list[tuple[int, str, str, int]] = []
        self.layer_sets: list[tuple[int, bytes]] = []
        self.steps: list[tuple[int, int, int, float | None, float, int]] = []
        self.values: dict[str, list[tuple[int, bytes]]] = {
            name: [] for name in (*_VALUE_TABLES, "status")
        }
        self.counts: list[tuple[int, bytes, bytes]] = []
        self.events: list[tuple[int, int, str, str | None, str]] = []
        self.origins: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self.steps)


class RecordingWriter:
    """Write steps to a recording from a background thread; see the module docstring.

    ``tree``: the model's module tree (stored once). ``settings``: any JSON-able dict of run
    settings. ``overwrite``: replace an existing recording (never a file that is not one, nor
    one another process is writing); without it an existing file is an error.
    ``info``: extra metadata, ``source`` and ``device`` are used by ``gradscope report``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        tree: ModuleTree | None = None,
        settings: Mapping[str, Any] | None = None,
        *,
        overwrite: bool = False,
        commit_seconds: float = 1.0,
        commit_steps: int = 500,
        max_pending: int = 1024,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.commit_seconds = float(commit_seconds)
        self.commit_steps = max(1, int(commit_steps))
        self.dropped = 0
        self._unreported_drops = 0
        self._warned = False
        self._closed = False
        self._failure: BaseException | None = None
        self._token = uuid.uuid4().hex
        self.max_pending = max(1, int(max_pending))
        # A deque, not a queue.Queue: appending takes no lock and wakes nobody, so the writer
        # thread sleeps until a commit is due and then takes the GIL once for the whole batch
        # instead of once per step (each hand-off can stall the training thread).
        self._pending: deque[Any] = deque()
        self._wake = threading.Event()
        header = self._header(tree, settings, info or {})
        self._connection = self._open(overwrite, header)
        # Writer-thread state.
        self._next_row = 0
        self._set_ids: dict[tuple[str, ...], tuple[int, np.ndarray]] = {}
        self._last_layers: Sequence[LayerInfo] | None = None
        self._last_set: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int32))
        self._positions: dict[str, int] = {}
        self._previous_status = np.zeros(0, dtype=np.uint8)
        self._worst = np.zeros(0, dtype=np.uint8)
        self.thread_seconds = 0.0  # CPU time the writer thread spent (for the benchmark)
        self._thread = threading.Thread(target=self._run, name="gradscope-recording", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- opening ----------------------------------------------------------------------
    def _open(
        self, overwrite: bool, header: list[tuple[str, list[tuple[Any, ...]]]]
    ) -> sqlite3.Connection:
        path = self.path
        exists = path.exists() and path.stat().st_size > 0
        if exists:
            _check_header(path)
        elif path.exists() and not overwrite:
            raise GradScopeError(f"{path} already exists (an empty file); pass overwrite=True")
        if not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            connection = _connect(path, read_only=False)
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as error:
            raise GradScopeError(f"cannot write a recording at {path}: {error}") from None
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                if exists:
                    _read_meta(connection, path)
                    row = connection.execute(
                        "SELECT pid, host, heartbeat FROM writer_lock WHERE id = 1"
                    ).fetchone()
                    if row is not None and _lock_is_held(*row):
                        raise GradScopeError(
                            f"{path} is being written by {_describe_writer(row[0], row[1])}; "
                            "two processes cannot write one recording (choose another file)"
                        )
                    if not overwrite:
                        raise GradScopeError(
                            f"{path} already exists; choose a new file name or pass "
                            "overwrite=True to replace it"
                        )
                    for table in _TABLES:
                        connection.execute(f"DROP TABLE IF EXISTS {table}")
                # (not executescript: it would commit the transaction first)
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        connection.execute(statement)
                connection.execute(
                    "INSERT INTO writer_lock(id, pid, host, token, heartbeat) VALUES (1,?,?,?,?)",
                    (os.getpid(), socket.gethostname(), self._token, time.time()),
                )
                # The header goes in the same transaction: a reader never sees a recording
                # without its metadata.
                for statement, rows in header:
                    connection.executemany(statement, rows)
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as error:
            connection.close()
            if "locked" in str(error) or "busy" in str(error):
                raise GradScopeError(
                    f"{path} is being written by another process; two processes cannot "
                    "write one recording"
                ) from None
            raise GradScopeError(f"cannot write a recording at {path}: {error}") from None
        except sqlite3.DatabaseError as error:
            connection.close()
            raise _damaged(path, error) from None
        except BaseException:
            connection.close()
            raise
        return connection

    @staticmethod
    def _header(
        tree: ModuleTree | None, settings: Mapping[str, Any] | None, info: Mapping[str, Any]
    ) -> list[tuple[str, list[tuple[Any, ...]]]]:
        import gradscope

        meta: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "gradscope_version": gradscope.__version__,
            "created": time.time(),
            "finished": 0,
            "rows": 0,
            "dropped": 0,
            "settings": json.dumps(dict(settings), default=str) if settings is not None else None,
            "worst_status": b"",
        }
        for key, value in info.items():
            meta[f"info.{key}"] = str(value)
        header = [("INSERT INTO meta(key, value) VALUES (?, ?)", list(meta.items()))]
        if tree is not None:
            header.append(
                (
                    "INSERT INTO tree(position, name, type, own_params, total_params) "
                    "VALUES (?,?,?,?,?)",
                    [(i, *row) for i, row in enumerate(tree.rows())],
                )
            )
        return header

    # -- the training thread's side ---------------------------------------------------
    def append(
        self,
        stats: StepStats,
        layers: Sequence[LayerInfo],
        *,
        loss: float | None = None,
        origin: Origin | None = None,
    ) -> bool:
        """Queue one step (``layers``: the watch's ``layers``, in the order of ``stats``'s
        arrays). ``loss`` overrides ``stats.loss``. Never waits for the disk (see the module
        docstring for the one exception); returns False when the step was dropped."""
        if self._closed:
            raise GradScopeError(f"the recording {self.path} is closed")
        if self._failure is not None:
            self.dropped += 1
            return False
        pending = self._pending
        if len(pending) >= self.max_pending and origin is not None:
            # The first NaN/Inf's step is the one a user opens the recording for: wait.
            waited_until = time.monotonic() + ORIGIN_WAIT_SECONDS
            while len(pending) >= self.max_pending and time.monotonic() < waited_until:
                self._wake.set()
                time.sleep(0.005)
        if len(pending) >= self.max_pending:
            self.dropped += 1
            self._unreported_drops += 1
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"the recording {self.path} fell behind; steps are being dropped from it "
                    "(training is not slowed down)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self._wake.set()
            return False
        pending.append((stats, layers, loss, origin, self._unreported_drops))
        self._unreported_drops = 0
        if len(pending) >= self.commit_steps:
            self._wake.set()
        return True

    def rewind_to(self, step: int) -> None:
        """Forget step ``step`` and every later one (the app rewound the run: a new branch
        replaces them), as :meth:`RunHistory.rewind_to` does. Queued like a step; readers
        following the recording rewind their history too."""
        if self._closed:
            raise GradScopeError(f"the recording {self.path} is closed")
        self._pending.append(_Rewind(int(step)))
        self._wake.set()

    def flush(self, timeout: float | None = 30.0) -> None:
        """Commit everything queued so far; returns when it is on disk (or on timeout)."""
        if self._closed or not self._thread.is_alive():
            return
        done = threading.Event()
        self._pending.append(done)
        self._wake.set()
        done.wait(timeout)
        self._raise_failure()

    def close(self) -> None:
        """Commit what is queued, mark the recording finished and release the lock."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._thread.is_alive():
            self._pending.append(_STOP)
            self._wake.set()
            self._thread.join()
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            if isinstance(failure, GradScopeError):
                raise failure
            raise GradScopeError(f"writing the recording {self.path} failed: {failure}")

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- the writer thread ------------------------------------------------------------
    def _run(self) -> None:
        started = time.thread_time()
        last_commit = time.monotonic()
        stopping = False
        try:
            while not stopping:
                # Sleep until a commit is due; the training thread wakes us early for a full
                # batch, a full queue, a flush or close.
                self._wake.wait(min(self.commit_seconds, HEARTBEAT_SECONDS))
                self._wake.clear()
                batch, markers = _Batch(), []
                pending = self._pending
                while pending:
                    item = pending.popleft()
                    if item is _STOP:
                        stopping = True
                    elif isinstance(item, threading.Event):
                        markers.append(item)
                    elif isinstance(item, _Rewind):
                        self._commit(batch)
                        batch = _Batch()
                        self._rewind(item.step)
                    else:
                        self._pack(batch, *item)
                now = time.monotonic()
                if batch or markers or stopping or now >= last_commit + HEARTBEAT_SECONDS:
                    # An empty batch still refreshes the heartbeat that marks the lock live.
                    self._commit(batch, finished=stopping)
                    last_commit = now
                for marker in markers:
                    marker.set()
        except BaseException as error:  # disk full, file removed, lock taken over...
            self._failure = error
            warnings.warn(
                f"recording to {self.path} stopped: {error}", RuntimeWarning, stacklevel=1
            )
            self._drain()
        finally:
            self.thread_seconds = time.thread_time() - started
            try:
                self._connection.close()
            except sqlite3.Error:
                pass

    def _drain(self) -> None:
        # Unblock flush() callers after a failure; the queued steps are lost.
        while self._pending:
            item = self._pending.popleft()
            if isinstance(item, threading.Event):
                item.set()

    def _layer_set(self, batch: _Batch, layers: Sequence[LayerInfo]) -> tuple[int, np.ndarray]:
        if layers is self._last_layers:
            return self._last_set
        names = tuple(layer.name for layer in layers)
        found = self._set_ids.get(names)
        if found is None:
            for layer in layers:
                if layer.name not in self._positions:
                    position = len(self._positions)
                    self._positions[layer.name] = position
                    batch.layers.append((position, layer.name, layer.type_name, layer.num_params))
            count = len(self._positions)
            if count > len(self._worst):
                self._worst = np.concatenate(
                    [self._worst, np.zeros(count - len(self._worst), dtype=np.uint8)]
                )
                self._previous_status = np.concatenate(
                    [
                        self._previous_status,
                        np.full(count - len(self._previous_status), STATUS_OK, dtype=np.uint8),
                    ]
                )
            positions = np.fromiter(
                (self._positions[n] for n in names), dtype=np.int32, count=len(names)
            )
            found = (len(self._set_ids), positions)
            self._set_ids[names] = found
            batch.layer_sets.append((found[0], positions.tobytes()))
        self._last_layers, self._last_set = layers, found
        return found

    def _pack(
        self,
        batch: _Batch,
        stats: StepStats,
        layers: Sequence[LayerInfo],
        loss: float | None,
        origin: Origin | None,
        dropped_before: int,
    ) -> None:
        set_id, positions = self._layer_set(batch, layers)
        row = self._next_row
        self._next_row += 1
        step = int(stats.step)
        if dropped_before:
            first = step - dropped_before
            batch.events.append(
                (
                    row,
                    step,
                    "gap",
                    None,
                    f"steps {first}-{step - 1}: not recorded (the recording fell behind)",
                )
            )
        loss = stats.loss if loss is None else float(loss)
        flags = 0
        if loss is not None:
            flags |= _FLAG_LOSS_GIVEN
            if not math.isfinite(loss):
                flags |= _FLAG_LOSS_NONFINITE
        if stats.unwatched_nonfinite:
            flags |= _FLAG_UNWATCHED_NONFINITE
        # SQLite stores a NaN REAL as NULL; the flags tell a NaN loss from no loss.
        batch.steps.append((row, step, set_id, loss, float(stats.total_grad_norm), flags))
        values = batch.values
        packed = _to_float32(np.stack((stats.grad_norm, stats.max_abs, stats.weight_norm)))
        values["grad_norm"].append((row, packed[0].tobytes()))
        values["max_abs"].append((row, packed[1].tobytes()))
        values["weight_norm"].append((row, packed[2].tobytes()))
        if stats.update_ratio is not None:
            values["update_ratio"].append((row, _to_float32(stats.update_ratio).tobytes()))
        status = np.asarray(stats.status, dtype=np.uint8)
        values["status"].append((row, status.tobytes()))
        if np.any(stats.nan_count) or np.any(stats.inf_count):
            batch.counts.append(
                (
                    row,
                    np.asarray(stats.nan_count, dtype=np.int64).tobytes(),
                    np.asarray(stats.inf_count, dtype=np.int64).tobytes(),
                )
            )
        # Status onsets, exactly as RunHistory notes them.
        names = [layer.name for layer in layers]
        before = self._previous_status[positions]
        for event in status_onsets(step, names, status, before, stats.grad_norm):
            batch.events.append((row, step, event.kind, event.layer, event.message))
        self._previous_status[positions] = status
        self._worst[positions] = np.maximum(self._worst[positions], status)
        if origin is not None:
            batch.events.append((row, step, "origin", origin.module, origin.describe()))
            batch.origins.append((row, json.dumps(origin.to_dict(), default=str)))

    def _rewind(self, step: int) -> None:
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            self._check_owner()
            # Rewinds delete the abandoned branch, so step numbers never decrease by row.
            cut = connection.execute("SELECT MIN(row) FROM steps WHERE step >= ?", (step,))
            cut_row = cut.fetchone()[0]
            if cut_row is None:
                connection.execute("COMMIT")
                return
            for table in _ROW_TABLES:
                connection.execute(f"DELETE FROM {table} WHERE row >= ?", (cut_row,))
            connection.execute("INSERT INTO rewinds(step, row) VALUES (?, ?)", (step, int(cut_row)))
            # Worst statuses and onset tracking as of the steps that remain.
            sets = {
                set_id: np.frombuffer(blob, dtype=np.int32)
                for set_id, blob in connection.execute("SELECT id, positions FROM layer_sets")
            }
            self._worst[:] = STATUS_OK
            self._previous_status[:] = STATUS_OK
            last: tuple[np.ndarray, np.ndarray] | None = None
            for set_id, blob in connection.execute(
                "SELECT s.layer_set, v.data FROM steps AS s JOIN status AS v ON v.row = s.row "
                "ORDER BY s.row"
            ):
                positions, status = sets[set_id], np.frombuffer(blob, dtype=np.uint8)
                self._worst[positions] = np.maximum(self._worst[positions], status)
                last = (positions, status)
            if last is not None:
                self._previous_status[last[0]] = last[1]
            self._next_row = int(cut_row)
            connection.executemany(
                "UPDATE meta SET value = ? WHERE key = ?",
                [(self._next_row, "rows"), (self._worst.tobytes(), "worst_status")],
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    def _check_owner(self) -> None:
        owner = self._connection.execute("SELECT token FROM writer_lock WHERE id = 1").fetchone()
        if owner is None or owner[0] != self._token:
            raise GradScopeError(
                f"another process took over the recording {self.path} (this writer's "
                f"heartbeat was older than {STALE_SECONDS:.0f} s); recording stopped"
            )

    def _commit(self, batch: _Batch, finished: bool = False) -> None:
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            self._check_owner()
            if batch.layers:
                connection.executemany(
                    "INSERT INTO layers(position, name, type, params) VALUES (?,?,?,?)",
                    batch.layers,
                )
            if batch.layer_sets:
                connection.executemany(
                    "INSERT INTO layer_sets(id, positions) VALUES (?,?)", batch.layer_sets
                )
            if batch.steps:
                connection.executemany(
                    "INSERT INTO steps(row, step, layer_set, loss, total_grad_norm, flags) "
                    "VALUES (?,?,?,?,?,?)",
                    batch.steps,
                )
                for table, rows in batch.values.items():
                    if rows:
                        connection.executemany(f"INSERT INTO {table}(row, data) VALUES (?,?)", rows)
                if batch.counts:
                    connection.executemany(
                        "INSERT INTO nonfinite_counts(row, nan, inf) VALUES (?,?,?)",
                        batch.counts,
                    )
                if batch.events:
                    connection.executemany(
                        "INSERT INTO events(row, step, kind, layer, message) VALUES (?,?,?,?,?)",
                        batch.events,
                    )
                if batch.origins:
                    connection.executemany(
                        "INSERT INTO origins(row, data) VALUES (?,?)", batch.origins
                    )
                connection.executemany(
                    "UPDATE meta SET value = ? WHERE key = ?",
                    [
                        (self._next_row, "rows"),
                        (self._worst.tobytes(), "worst_status"),
                        (self.dropped, "dropped"),
                    ],
                )
            if finished:
                connection.execute("UPDATE meta SET value = 1 WHERE key = 'finished'")
                connection.execute(
                    "UPDATE meta SET value = ? WHERE key = 'dropped'", (self.dropped,)
                )
                connection.execute("DELETE FROM writer_lock")
            else:
                connection.execute(
                    "UPDATE writer_lock SET heartbeat = ? WHERE id = 1", (time.time(),)
                )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        if finished:
            # Fold the WAL into the file, so a finished recording is one file again.
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


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


# -- reading ------------------------------------------------------------------------------
class RecordingReader:
    """Read a recording, also while another process writes it.

    ``load()`` -> ``(tree, history)``; then ``read_new_steps(history)`` appends what was
    committed since (follow mode) and ``is_live()`` says whether a writer is still at it.
    Every problem with the file is a :class:`GradScopeError` with one clear message.
    A reader holds one SQLite connection: use it from one thread at a time (the app's
    worker, say), or give each thread its own reader.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        _check_header(self.path)
        try:
            self._connection = _connect(self.path, read_only=True)
        except sqlite3.Error as error:
            raise GradScopeError(f"cannot open the recording {self.path}: {error}") from None
        try:
            meta = _read_meta(self._connection, self.path)
            self.format_version: int = meta["format_version"]
            self._created = meta.get("created")
            self.settings: dict[str, Any] = json.loads(meta["settings"] or "null") or {}
            self.info: dict[str, str] = {
                key[5:]: value for key, value in meta.items() if key.startswith("info.")
            }
            tree_rows = self._connection.execute(
                "SELECT name, type, own_params, total_params FROM tree ORDER BY position"
            ).fetchall()
        except sqlite3.DatabaseError as error:
            self._connection.close()
            raise _damaged(self.path, error) from None
        except BaseException:
            self._connection.close()
            raise
        self.tree: ModuleTree | None = ModuleTree.from_rows(tree_rows) if tree_rows else None
        self.loss_recorded = np.zeros(0, dtype=bool)
        self.decimation = 1
        self._last_row = -1
        self._last_event = 0
        self._last_rewind = 0
        self._layer_names: list[str] = []
        self._layer_types: list[str] = []
        self._layer_params: list[int] = []
        self._sets: dict[int, np.ndarray] = {}

    @property
    def source(self) -> str:
        return self.info.get("source") or str(self.settings.get("source") or self.path)

    @property
    def device(self) -> str:
        return self.info.get("device") or str(self.settings.get("device") or "unknown")

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> RecordingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- status -----------------------------------------------------------------------
    def _query(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._connection.execute(sql, parameters).fetchall()
        except sqlite3.DatabaseError as error:
            raise _damaged(self.path, error) from None

    def is_live(self) -> bool:
        """True while a writer holds the recording (and is alive)."""
        row = self._query("SELECT pid, host, heartbeat FROM writer_lock WHERE id = 1")
        return bool(row) and _lock_is_held(*row[0])

    def is_finished(self) -> bool:
        """True when the writer closed it properly (False after a crash, or while live)."""
        return self._query("SELECT value FROM meta WHERE key = 'finished'") == [(1,)]

    def row_count(self) -> int:
        """Steps recorded so far (committed ones)."""
        found = self._query("SELECT MAX(row) FROM steps")
        return 0 if found[0][0] is None else int(found[0][0]) + 1

    @property
    def layer_names(self) -> list[str]:
        """The recorded layers, in order of first appearance (history columns)."""
        try:
            self._refresh_layers()
        except sqlite3.DatabaseError as error:
            raise _damaged(self.path, error) from None
        return list(self._layer_names)

    # -- loading ----------------------------------------------------------------------
    def load(self, max_rows: int | None = None) -> tuple[ModuleTree | None, RunHistory]:
        """The module tree (None when the writer stored none) and a history of the steps
        committed so far. With ``max_rows``, a longer recording is decimated: every k-th
        step, plus every step with an event (onsets, the origin) and the last step; each
        layer's worst status still covers every step."""
        history = RunHistory()
        self._last_row, self._last_event = -1, 0
        found = self._query("SELECT MAX(id) FROM rewinds")
        self._last_rewind = found[0][0] or 0
        self.loss_recorded = np.zeros(0, dtype=bool)
        stride = 1
        if max_rows is not None:
            stride = max(1, math.ceil(self.row_count() / max(1, max_rows)))
        self.decimation = stride
        self._read(history, stride)
        return self.tree, history

    def read_new_steps(self, history: RunHistory) -> int:
        """Append the steps committed since the last ``load``/``read_new_steps`` to
        ``history`` (the one ``load`` returned); returns how many were added."""
        return self._read(history, 1)

    def read_window(
        self, start_row: int, stop_row: int | None = None, max_rows: int | None = None
    ) -> RunHistory:
        """A separate history of rows ``start_row:stop_row`` (a zoomed-in view at full
        resolution, or decimated to about ``max_rows`` like ``load``); follow mode's
        position is untouched. Events are those of the window; a loss not recorded is NaN.
        Decimated, each layer's worst status is that of the whole run."""
        history = RunHistory()
        stop = self.row_count() if stop_row is None else max(start_row, stop_row)
        stride = 1
        if max_rows is not None:
            stride = max(1, math.ceil((stop - start_row) / max(1, max_rows)))
        self._read(history, stride, (max(0, start_row), stop))
        return history

    def _read(self, history: RunHistory, stride: int, window: tuple[int, int] | None = None) -> int:
        connection = self._connection
        try:
            connection.execute("BEGIN")  # one snapshot across all tables
            try:
                added = self._read_block(history, stride, window)
            finally:
                connection.execute("COMMIT")
        except sqlite3.DatabaseError as error:
            raise _damaged(self.path, error) from None
        except (ValueError, KeyError, IndexError) as error:
            raise _damaged(self.path, error) from None
        return added

    def _refresh_layers(self) -> None:
        connection = self._connection
        for _position, name, type_name, params in connection.execute(
            "SELECT position, name, type, params FROM layers WHERE position >= ? ORDER BY position",
            (len(self._layer_names),),
        ):
            self._layer_names.append(name)
            self._layer_types.append(type_name)
            self._layer_params.append(int(params))
        known = max(self._sets, default=-1)
        for set_id, blob in connection.execute(
            "SELECT id, positions FROM layer_sets WHERE id > ? ORDER BY id", (known,)
        ):
            self._sets[int(set_id)] = np.frombuffer(blob, dtype=np.int32)

    def _read_block(self, history: RunHistory, stride: int, window: tuple[int, int] | None) -> int:
        """Append rows to ``history``: those after the last read (``window`` None: follow
        mode) or those of ``window`` (first row, stop row), every ``stride``-th plus the rows
        with events and the last one."""
        connection = self._connection
        created = connection.execute("SELECT value FROM meta WHERE key = 'created'").fetchone()
        if created is None or created[0] != self._created:
            raise GradScopeError(
                f"{self.path} was replaced by a new recording while it was open; open it again"
            )
        self._refresh_layers()
        follow = window is None
        if follow:
            self._follow_rewinds(history)
        first_row, stop_row = (self._last_row + 1, 2**62) if window is None else window
        span = "row >= ? AND row < ?"
        if stride > 1:
            newest = connection.execute(
                f"SELECT MAX(row) FROM steps WHERE {span}", (first_row, stop_row)
            ).fetchone()[0]
            selection = (
                f"{span} AND ((row - ?) % ? = 0 OR row = ? OR row IN (SELECT row FROM events))",
                (first_row, stop_row, first_row, stride, -1 if newest is None else newest),
            )
        else:
            selection = (span, (first_row, stop_row))
        step_rows = connection.execute(
            "SELECT row, step, layer_set, loss, total_grad_norm, flags FROM steps "
            f"WHERE {selection[0]} ORDER BY row",
            selection[1],
        ).fetchall()
        if follow:
            events = connection.execute(
                "SELECT id, step, kind, layer, message FROM events WHERE id > ? ORDER BY id",
                (self._last_event,),
            ).fetchall()
        else:
            events = connection.execute(
                f"SELECT id, step, kind, layer, message FROM events WHERE {span} ORDER BY id",
                (first_row, stop_row),
            ).fetchall()
        origin_data = None
        if history.first_nonfinite is None:
            found = connection.execute("SELECT data FROM origins ORDER BY id LIMIT 1").fetchone()
            origin_data = found[0] if found else None
        if not step_rows:
            self._add_events(history, events, origin_data, follow)
            return 0
        table = np.array([(r[0], r[1], r[2], r[5]) for r in step_rows], dtype=np.int64)
        rows, steps, set_ids, flags = table[:, 0], table[:, 1], table[:, 2], table[:, 3]
        n = len(rows)
        if stride > 1:
            # Look the chosen rows up by key: a condition on the row would still walk every
            # page of the value tables (their BLOBs live in the table's leaf pages).
            where, parameters = f"row IN ({','.join(map(str, rows.tolist()))})", ()
        else:
            where, parameters = span, (first_row, stop_row)
        loss_given = (flags & _FLAG_LOSS_GIVEN) != 0
        losses = np.array([np.nan if r[3] is None else r[3] for r in step_rows], dtype=np.float64)
        totals = np.array([np.nan if r[4] is None else r[4] for r in step_rows], dtype=np.float64)

        columns = history.ensure_layers(self._layer_names, self._layer_types, self._layer_params)
        start = history.count
        end = start + n
        if end > history._capacity:
            history._grow(max(end, 2 * history._capacity), history._layer_capacity)
        history.step_numbers[start:end] = steps
        history.loss[start:end] = losses
        history.total_grad_norm[start:end] = totals

        groups = {
            int(s): (np.flatnonzero(set_ids == s), columns[self._sets[int(s)]])
            for s in np.unique(set_ids)
        }
        sizes = np.zeros(n, dtype=np.int64)
        for members, layer_columns in groups.values():
            sizes[members] = len(layer_columns)
        # One layer set covering every column (the common case): plain 2-D copies.
        only = next(iter(groups.values()))[1] if len(groups) == 1 else None
        covers_all = only is not None and len(np.unique(only)) == len(history.layer_names)
        contiguous = (
            only is not None
            and len(only) > 0
            and np.array_equal(only, only[0] + np.arange(len(only)))
        )

        def scatter(target: np.ndarray, flat: np.ndarray, which: np.ndarray | None) -> None:
            """Put the concatenated per-row values of block rows ``which`` (None: all) into
            ``target`` (block rows x history columns)."""
            if which is None and only is not None:
                if len(flat) != n * len(only):
                    raise ValueError("stored values do not match their layers")
                values = flat.reshape(n, len(only))
                if contiguous:
                    target[:, only[0] : only[0] + len(only)] = values
                else:
                    target[:, only] = values
                return
            which = np.arange(n) if which is None else which
            local_offsets = np.concatenate([[0], np.cumsum(sizes[which])])
            if local_offsets[-1] != len(flat):
                raise ValueError("stored values do not match their layers")
            position = np.zeros(n, dtype=np.int64)
            position[which] = local_offsets[:-1]
            for members, layer_columns in groups.values():
                chosen = members[np.isin(members, which)]
                if len(chosen) == 0 or len(layer_columns) == 0:
                    continue
                gather = position[chosen][:, None] + np.arange(len(layer_columns))
                target[chosen[:, None], layer_columns[None, :]] = flat[gather]

        for name in _DENSE_TABLES:
            blobs = connection.execute(
                f"SELECT data FROM {name} WHERE {where} ORDER BY row", parameters
            ).fetchall()
            if len(blobs) != n:
                raise ValueError(f"{name} has {len(blobs)} rows for {n} steps")
            dtype = np.uint8 if name == "status" else np.float32
            flat = np.frombuffer(b"".join(b for (b,) in blobs), dtype=dtype)
            del blobs
            if name == "status":
                target = history._status[start:end]
                if not covers_all:
                    target[:] = STATUS_MISSING
            else:
                target = history._stats[name][start:end]
                if not covers_all:
                    target[:] = MISSING
            scatter(target, flat, None)
        ratios = history._stats["update_ratio"][start:end]
        ratios[:] = MISSING
        sparse = connection.execute(
            f"SELECT row, data FROM update_ratio WHERE {where} ORDER BY row", parameters
        ).fetchall()
        if sparse:
            which = np.searchsorted(rows, np.array([r for r, _ in sparse], dtype=np.int64))
            flat = np.frombuffer(b"".join(b for _, b in sparse), dtype=np.float32)
            scatter(ratios, flat, None if len(which) == n else which)

        block_status = history._status[start:end][:, columns]
        if stride == 1:
            seen = np.where(block_status == STATUS_MISSING, 0, block_status).max(axis=0)
        else:  # skipped steps count too: the writer keeps each layer's worst status
            stored = connection.execute(
                "SELECT value FROM meta WHERE key = 'worst_status'"
            ).fetchone()
            worst = np.frombuffer(stored[0] or b"", dtype=np.uint8)[: len(columns)]
            seen = np.zeros(len(columns), dtype=np.uint8)
            seen[: len(worst)] = worst
        history.worst_status[columns] = np.maximum(history.worst_status[columns], seen)
        # Let a later RunHistory.append continue the onsets where the recording stopped.
        for set_id in sorted(groups, key=lambda s: groups[s][0][-1]):
            members, layer_columns = groups[set_id]
            last_row = history._status[start + members[-1]]
            for column in layer_columns.tolist():
                history._previous_status[history.layer_names[column]] = int(last_row[column])
        history.count = end
        if follow:
            self.loss_recorded = np.concatenate([self.loss_recorded, loss_given])
            self._last_row = int(rows[-1])
        self._add_events(history, events, origin_data, follow)
        return n

    def _follow_rewinds(self, history: RunHistory) -> None:
        """The writer rewound (and deleted rows this history may hold): rewind too."""
        connection = self._connection
        rewinds = connection.execute(
            "SELECT id, step, row FROM rewinds WHERE id > ? ORDER BY row LIMIT 1",
            (self._last_rewind,),
        ).fetchone()
        if rewinds is None:
            return
        _, step, cut_row = rewinds
        history.rewind_to(int(step))
        self.loss_recorded = self.loss_recorded[: history.count]
        self._last_row = min(self._last_row, int(cut_row) - 1)
        kept = connection.execute("SELECT MAX(id) FROM events WHERE row < ?", (cut_row,))
        self._last_event = kept.fetchone()[0] or 0
        self._last_rewind = connection.execute("SELECT MAX(id) FROM rewinds").fetchone()[0]

    def _add_events(
        self, history: RunHistory, events: list[Any], origin_data: str | None, follow: bool
    ) -> None:
        for event_id, step, kind, layer, message in events:
            history.events.append(Event(int(step), kind, layer, message))
            if follow:
                self._last_event = int(event_id)
        if origin_data is not None and history.first_nonfinite is None:
            data = json.loads(origin_data)
            known = {f.name for f in dataclasses.fields(Origin)}
            history.first_nonfinite = Origin(**{k: v for k, v in data.items() if k in known})

    # -- lazy reading -----------------------------------------------------------------
    def read_statistic(
        self,
        statistic: str,
        layer: str,
        start_row: int = 0,
        stop_row: int | None = None,
        stride: int = 1,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One layer's ``statistic`` (or ``"status"``) over rows ``start_row:stop_row:stride``
        at full resolution, without loading anything else: ``(steps, values)``, with
        ``MISSING`` (``STATUS_MISSING`` for status) where the layer was not watched."""
        if statistic not in (*STATISTICS, "status"):
            raise GradScopeError(
                f"unknown statistic {statistic!r}; one of {', '.join((*STATISTICS, 'status'))}"
            )
        self._refresh_layers()
        if layer not in self._layer_names:
            raise GradScopeError(f"the recording has no layer {layer!r}")
        position = self._layer_names.index(layer)
        dtype = np.uint8 if statistic == "status" else np.float32
        size = np.dtype(dtype).itemsize
        stride = max(1, int(stride))
        connection = self._connection
        try:
            connection.execute("BEGIN")  # one snapshot for both queries
            try:
                stop = self.row_count() if stop_row is None else stop_row
                window = "s.row >= ? AND s.row < ? AND (s.row - ?) % ? = 0"
                bounds = (start_row, stop, start_row, stride)
                table = np.array(
                    connection.execute(
                        f"SELECT s.row, s.step FROM steps AS s WHERE {window} ORDER BY s.row",
                        bounds,
                    ).fetchall(),
                    dtype=np.int64,
                ).reshape(-1, 2)
                values = np.full(
                    len(table), STATUS_MISSING if statistic == "status" else MISSING, dtype=dtype
                )
                for set_id, positions in self._sets.items():
                    hits = np.flatnonzero(positions == position)
                    if not len(hits):
                        continue
                    # Only the layer's 4 bytes of each step's BLOB leave SQLite.
                    found = connection.execute(
                        f"SELECT s.row, substr(v.data, ?, ?) FROM steps AS s "
                        f"JOIN {statistic} AS v ON v.row = s.row "
                        f"WHERE s.layer_set = ? AND {window} ORDER BY s.row",
                        (int(hits[0]) * size + 1, size, set_id, *bounds),
                    ).fetchall()
                    if found:
                        rows = np.fromiter((r for r, _ in found), dtype=np.int64, count=len(found))
                        flat = np.frombuffer(b"".join(b for _, b in found), dtype=dtype)
                        if len(flat) != len(found):
                            raise ValueError(f"{statistic} values do not match their layers")
                        values[np.searchsorted(table[:, 0], rows)] = flat
            finally:
                connection.execute("COMMIT")
        except sqlite3.DatabaseError as error:
            raise _damaged(self.path, error) from None
        except ValueError as error:
            raise _damaged(self.path, error) from None
        return table[:, 1].copy(), values


# -- export -------------------------------------------------------------------------------
def write_csv(
    history: RunHistory,
    path: str | os.PathLike[str],
    layers: Sequence[str] | None = None,
) -> int:
    """Write ``step,layer,grad_norm,max_abs,weight_norm,update_ratio,status`` rows, one per
    step and watched layer (all layers, or ``layers``); an unmeasured value is empty, NaN
    and Inf are written as ``nan``, ``inf``, ``-inf``. Returns the number of rows."""
    names = list(history.layer_names if layers is None else layers)
    for name in names:
        if not history.has_layer(name):
            raise GradScopeError(f"no layer {name!r} in this run")
    status = history.status_matrix()
    steps = history.steps
    written = 0
    try:
        with open(path, "w", newline="", encoding="utf-8") as file:
            file.write(",".join(("step", "layer", *STATISTICS, "status")) + "\n")
            for name in names:
                column = history.column(name)
                watched = np.flatnonzero(status[:, column] != STATUS_MISSING)
                if not len(watched):
                    continue
                quoted = io.StringIO()
                csv.writer(quoted).writerow((name,))  # quoted only if it must be
                cells = [
                    _csv_column(history.matrix(statistic)[watched, column])
                    for statistic in STATISTICS
                ]
                labels = [STATUS_NAMES[code] for code in status[watched, column].tolist()]
                lines = zip(
                    map(str, steps[watched].tolist()),
                    itertools.repeat(quoted.getvalue().rstrip("\r\n")),
                    *cells,
                    labels,
                    strict=False,
                )
                file.write("\n".join(map(",".join, lines)) + "\n")
                written += len(watched)
    except OSError as error:
        raise GradScopeError(f"cannot write {path}: {error.strerror or error}") from None
    return written


def _csv_column(values: np.ndarray) -> list[str] | itertools.repeat[str]:
    """Text of one statistic's values: 9 significant digits (enough for float32 to read
    back exactly), ``nan``/``inf``/``-inf`` as such, empty where not measured."""
    missing = values == MISSING
    if missing.all():
        return itertools.repeat("")
    text = [f"{value:.9g}" for value in values.tolist()]
    for index in np.flatnonzero(missing).tolist():
        text[index] = ""
    return text
