"""Writing (:class:`RecordingWriter`): the training thread only appends the step's
:class:`~gradscope.core.watch.StepStats` to a bounded queue (a deque: no lock, no wake-up,
under a microsecond); a background thread sleeps until a commit is due, then packs the
batch and commits it, about once a second or every ``commit_steps`` steps, whichever comes
first. Waking once per commit rather than once per step matters: each time the writer
thread takes the GIL it can stall the training thread. When the queue is full (the disk
has fallen ``max_pending`` steps behind), the step is dropped from the recording rather
than stalling training, counted in :attr:`RecordingWriter.dropped`, warned about once, and
the recording gets a ``gap`` event naming the missing steps. The one exception is the step
that carries the first NaN/Inf origin (or an early warning): it waits (up to 5 s) for room,
because it is the step a user opens the recording for. Measured at 500 layers
(``benchmarks/recording.py``): under 1 us per step on the training thread, about 70 us of
writer-thread CPU per step, about 6.7 kB of file per step.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import math
import os
import socket
import sqlite3
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from gradscope._version import __version__
from gradscope.core.errors import GradScopeError
from gradscope.core.facts import (
    STATUS_FROZEN,
    LayerInfo,
    Origin,
    StatisticInfo,
    StepStats,
)
from gradscope.core.history import (
    StatusOnsets,
    _to_float32,
    owner_layers,
    statistic_rows,
)
from gradscope.core.module_tree import ModuleTree
from gradscope.core.recording.disk_full import disk_full_message, is_disk_full
from gradscope.core.recording.format import (
    _FLAG_LOSS_GIVEN,
    _FLAG_LOSS_NONFINITE,
    _FLAG_SCALE_COLLAPSED,
    _FLAG_SKIPPED,
    _FLAG_UNWATCHED_NONFINITE,
    _ROW_TABLES,
    _SCHEMA,
    _TABLES,
    _VALUE_TABLES,
    ABSENT_TABLE,
    FIGURE_TABLES,
    FORMAT_NAME,
    FORMAT_VERSION,
    OPTIONAL_TABLES,
    ORIGIN_WAIT_SECONDS,
    WARNING_TABLE,
    _check_header,
    _connect,
    _damaged,
    _read_meta,
)
from gradscope.core.recording.lock import (
    HEARTBEAT_SECONDS,
    STALE_SECONDS,
    _describe_writer,
    _lock_is_held,
)
from gradscope.core.recording.named_statistics import StatisticWriter, write_rows

# -- writing ------------------------------------------------------------------------------
_STOP = object()


@dataclasses.dataclass(frozen=True)
class _Rewind:
    step: int


@dataclasses.dataclass(frozen=True)
class _Info:
    key: str
    value: str


@dataclasses.dataclass(frozen=True)
class _Described:
    infos: tuple[StatisticInfo, ...]


class _Batch:
    """Rows packed by the writer thread, waiting for the next commit."""

    def __init__(self) -> None:
        self.layers: list[tuple[int, str, str, int]] = []
        self.layer_sets: list[tuple[int, bytes]] = []
        self.steps: list[
            tuple[int, int, int, float | None, float, int, float | None, float | None]
        ] = []
        self.params: list[tuple[int, str, str]] = []
        self.param_sets: list[tuple[int, bytes]] = []
        self.param_norms: list[tuple[int, int, bytes]] = []
        self.values: dict[str, list[tuple[int, bytes]]] = {
            name: [] for name in (*_VALUE_TABLES, "status")
        }
        self.counts: list[tuple[int, bytes, bytes]] = []
        self.events: list[tuple[int, int, str, str | None, str]] = []
        self.origins: list[tuple[int, str]] = []
        self.warnings: list[tuple[int, str]] = []
        self.info: list[tuple[str, str]] = []
        # The named statistics (see named_statistics.py): described, and their figures.
        self.statistics: list[tuple[Any, ...]] = []
        self.figures: list[tuple[int, int, bytes]] = []
        self.absent: list[tuple[int, int, bytes]] = []

    def __len__(self) -> int:
        return len(self.steps) + len(self.statistics)


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
        # The warning the writer thread gave when it stopped (None while it writes).
        self.stopped: str | None = None
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
        self._committed_rows = 0
        self._set_ids: dict[tuple[str, ...], tuple[int, np.ndarray]] = {}
        self._last_layers: Sequence[LayerInfo] | None = None
        self._last_set: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int32))
        self._positions: dict[str, int] = {}
        self._param_positions: dict[str, int] = {}
        self._param_set_ids: dict[tuple[str, ...], tuple[int, int]] = {}
        self._last_param_set: tuple[Sequence[LayerInfo] | None, tuple[int, int]] = (None, (-1, 0))
        self._onsets = StatusOnsets()
        self._worst = np.zeros(0, dtype=np.uint8)
        self._statistics = StatisticWriter()
        self.thread_seconds = 0.0  # CPU time the writer thread spent (for the benchmark)
        self._thread = threading.Thread(target=self._run, name="gradscope-recording", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- opening ----------------------------------------------------------------------
    def _open(
        self, overwrite: bool, header: list[tuple[str, list[tuple[Any, ...]]]]
    ) -> sqlite3.Connection:
        path = self.path
        new_file = not path.exists()  # removed again if creating it fails
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
            if new_file:
                _remove_new_file(path)
            reason = disk_full_message(path, error) if is_disk_full(error) else error
            raise GradScopeError(f"cannot write a recording at {path}: {reason}") from None
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
                    dropped = (*_TABLES, *OPTIONAL_TABLES, *FIGURE_TABLES, WARNING_TABLE)
                    for table in (*dropped, ABSENT_TABLE):
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
                _roll_back(connection)
                raise
        except sqlite3.OperationalError as error:
            connection.close()
            if new_file:
                _remove_new_file(path)
            if is_disk_full(error):
                raise GradScopeError(
                    f"cannot write a recording at {path}: {disk_full_message(path, error)}"
                ) from None
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
            if new_file:
                _remove_new_file(path)
            raise
        return connection

    @staticmethod
    def _header(
        tree: ModuleTree | None, settings: Mapping[str, Any] | None, info: Mapping[str, Any]
    ) -> list[tuple[str, list[tuple[Any, ...]]]]:
        meta: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "gradscope_version": __version__,
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
        notes: Sequence[tuple[str, str]] = (),
    ) -> bool:
        """Queue one step (``layers``: the watch's ``layers``, in the order of ``stats``'s
        arrays). ``loss`` overrides ``stats.loss``. ``notes``: (kind, message) events of the
        run at this step, e.g. ("settings", "lr 0.1 -> 0.01") when the settings changed
        before it. Never waits for the disk (see the module docstring for the one
        exception); returns False when the step was dropped."""
        if self._closed:
            raise GradScopeError(f"the recording {self.path} is closed")
        if self._failure is not None:
            self.dropped += 1
            return False
        pending = self._pending
        if len(pending) >= self.max_pending and (origin is not None or stats.warnings):
            # The first NaN/Inf's step is the one a user opens the recording for, and an
            # early warning's the one that says it was coming (each module warns once): wait.
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
        pending.append((stats, layers, loss, origin, self._unreported_drops, tuple(notes)))
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

    def set_info(self, key: str, value: Any) -> None:
        """Replace one ``info`` entry (say the device, once a model built on the meta device
        got real storage); written with the next commit."""
        if self._closed:
            raise GradScopeError(f"the recording {self.path} is closed")
        self._pending.append(_Info(f"info.{key}", str(value)))

    def describe_statistics(self, infos: Sequence[StatisticInfo]) -> None:
        """Store what the watch says of its statistics (``GradientWatch.statistic_infos``:
        labels, schedules), by name; written with the next commit. A statistic seen in a
        step but never described is stored by its name alone."""
        if self._closed:
            raise GradScopeError(f"the recording {self.path} is closed")
        self._pending.append(_Described(tuple(infos)))

    def flush(self, timeout: float | None = 30.0) -> None:
        """Commit everything queued so far; returns when it is on disk (or on timeout)."""
        if self._closed:
            return
        if not self._thread.is_alive():  # it stopped: say why, if it failed
            self._raise_failure()
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
                    elif isinstance(item, _Info):
                        batch.info.append((item.key, item.value))
                    elif isinstance(item, _Described):
                        self._statistics.describe(item.infos, batch.statistics)
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
            self._release_lock()
            if is_disk_full(error):
                reason = (
                    f"{disk_full_message(self.path, error)}; the {self._committed_rows} step(s) "
                    "committed before stay readable, training goes on"
                )
            else:
                reason = str(error)
            self.stopped = f"recording to {self.path} stopped: {reason}"
            warnings.warn(self.stopped, RuntimeWarning, stacklevel=1)
            self._drain()
        finally:
            self.thread_seconds = time.thread_time() - started
            try:
                self._connection.close()
            except sqlite3.Error:
                pass

    def _release_lock(self) -> None:
        """After a failure: this writer writes no more, so readers must not see the file as
        live until its heartbeat goes stale (30 s). Only our own lock row goes (a writer that
        was taken over leaves the new owner's); best effort, the file may be gone."""
        try:
            if self._connection.in_transaction:
                self._connection.execute("ROLLBACK")
            self._connection.execute("DELETE FROM writer_lock WHERE token = ?", (self._token,))
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
            positions = np.fromiter(
                (self._positions[n] for n in names), dtype=np.int32, count=len(names)
            )
            found = (len(self._set_ids), positions)
            self._set_ids[names] = found
            batch.layer_sets.append((found[0], positions.tobytes()))
        self._last_layers, self._last_set = layers, found
        return found

    def _param_set(self, batch: _Batch, layers: Sequence[LayerInfo]) -> tuple[int, int]:
        """The id and size of the parameter set of ``layers``: their parameters in the
        watch's order (``GradientWatch.param_names``: each once, in the order the layers
        first list it), added to the file when new."""
        if layers is self._last_param_set[0]:
            return self._last_param_set[1]
        seen: dict[str, None] = {}
        for layer in layers:
            seen.update(dict.fromkeys(layer.param_names))
        names = tuple(seen)
        found = self._param_set_ids.get(names)
        if found is None:
            owners = owner_layers(
                names, [la.param_names for la in layers], [la.name for la in layers]
            )
            for name, owner in zip(names, owners, strict=True):
                if name not in self._param_positions:
                    position = len(self._param_positions)
                    self._param_positions[name] = position
                    batch.params.append((position, name, owner))
            positions = np.fromiter(
                (self._param_positions[n] for n in names), dtype=np.int32, count=len(names)
            )
            found = (len(self._param_set_ids), len(names))
            self._param_set_ids[names] = found
            batch.param_sets.append((found[0], positions.tobytes()))
        self._last_param_set = (layers, found)
        return found

    def _pack(
        self,
        batch: _Batch,
        stats: StepStats,
        layers: Sequence[LayerInfo],
        loss: float | None,
        origin: Origin | None,
        dropped_before: int,
        notes: tuple[tuple[str, str], ...] = (),
    ) -> None:
        set_id, positions = self._layer_set(batch, layers)
        row = self._next_row
        self._next_row += 1
        step = int(stats.step)
        for kind, message in notes:
            batch.events.append((row, step, kind, None, message))
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
        if stats.skipped:
            flags |= _FLAG_SKIPPED
        if stats.scale_collapsed:
            flags |= _FLAG_SCALE_COLLAPSED
        # SQLite stores a NaN REAL as NULL; the flags tell a NaN loss from no loss.
        batch.steps.append(
            (
                row,
                step,
                set_id,
                loss,
                float(stats.total_grad_norm),
                flags,
                stats.loss_scale,
                stats.wall_time,
            )
        )
        param_set, param_count = self._param_set(batch, layers)
        if stats.param_grad_norm is not None and len(stats.param_grad_norm) == param_count:
            batch.param_norms.append((row, param_set, _to_float32(stats.param_grad_norm).tobytes()))
        self._statistics.pack(
            stats, row, len(positions), batch.statistics, batch.figures, batch.absent
        )
        values = batch.values
        packed = statistic_rows(stats)
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
        # Status onsets, as RunHistory notes them (the same StatusOnsets).
        names = [layer.name for layer in layers]
        for event in self._onsets.step(
            step, names, status, stats.grad_norm, stats.tiny_reasons, key=layers
        ):
            batch.events.append((row, step, event.kind, event.layer, event.message))
        self._worst[positions] = np.maximum(self._worst[positions], status)
        for kind, layer, message in stats.episode_events or ():
            batch.events.append((row, step, kind, layer, message))
        if origin is not None:
            batch.events.append((row, step, "origin", origin.module, origin.describe()))
            batch.origins.append((row, json.dumps(origin.to_dict(), default=str)))
        for warning in stats.warnings:
            batch.events.append((row, step, "warning", warning.module, warning.describe()))
            batch.warnings.append((row, json.dumps(warning.to_json())))

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
            # What the abandoned branch was stays in the record as a "rewind" event (with its
            # first NaN/Inf, if any), like the rewinds before it that it would delete: a
            # report of the recording tells both branches.
            abandoned = connection.execute(
                "SELECT MIN(step), MAX(step), COUNT(*) FROM steps WHERE row >= ?", (cut_row,)
            ).fetchone()
            origin = connection.execute(
                "SELECT message FROM events WHERE row >= ? AND kind = 'origin' ORDER BY row "
                "LIMIT 1",
                (cut_row,),
            ).fetchone()
            carried = connection.execute(
                "SELECT step, message FROM events WHERE row >= ? AND kind = 'rewind' ORDER BY id",
                (cut_row,),
            ).fetchall()
            for table in _ROW_TABLES:
                connection.execute(f"DELETE FROM {table} WHERE row >= ?", (cut_row,))
            connection.execute("INSERT INTO rewinds(step, row) VALUES (?, ?)", (step, int(cut_row)))
            first, last, count = abandoned
            message = (
                f"rewound to before step {step}: the abandoned branch ran steps {first}-{last} "
                f"({count} recorded)"
            )
            message += f"; its first NaN/Inf: {origin[0]}" if origin else "; it had no NaN/Inf"
            # On the row of the new branch's first step (the step it rewound to): a follower
            # reads it with that step, after its own rewind.
            event_row = int(cut_row)
            connection.executemany(
                "INSERT INTO events(row, step, kind, layer, message) VALUES (?,?,?,?,?)",
                [(event_row, int(s_), "rewind", None, m) for s_, m in carried]
                + [(event_row, step, "rewind", None, message)],
            )
            # Worst statuses and onset tracking as of the steps that remain.
            sets = {
                set_id: np.frombuffer(blob, dtype=np.int32)
                for set_id, blob in connection.execute("SELECT id, positions FROM layer_sets")
            }
            self._worst[:] = STATUS_FROZEN  # the lowest: any status seen replaces it
            self._onsets.forget()
            last: tuple[np.ndarray, np.ndarray] | None = None
            for set_id, blob in connection.execute(
                "SELECT s.layer_set, v.data FROM steps AS s JOIN status AS v ON v.row = s.row "
                "ORDER BY s.row"
            ):
                positions, status = sets[set_id], np.frombuffer(blob, dtype=np.uint8)
                self._worst[positions] = np.maximum(self._worst[positions], status)
                last = (positions, status)
            if last is not None:
                by_position = dict(zip(self._positions.values(), self._positions, strict=True))
                self._onsets.set([by_position[p] for p in last[0].tolist()], last[1])
            self._next_row = int(cut_row)
            connection.executemany(
                "UPDATE meta SET value = ? WHERE key = ?",
                [(self._next_row, "rows"), (self._worst.tobytes(), "worst_status")],
            )
            connection.execute("COMMIT")
        except BaseException:
            _roll_back(connection)
            raise
        self._committed_rows = self._next_row

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
            if batch.info:
                connection.executemany(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", batch.info
                )
            if batch.layers:
                connection.executemany(
                    "INSERT INTO layers(position, name, type, params) VALUES (?,?,?,?)",
                    batch.layers,
                )
            if batch.layer_sets:
                connection.executemany(
                    "INSERT INTO layer_sets(id, positions) VALUES (?,?)", batch.layer_sets
                )
            if batch.params:
                connection.executemany(
                    "INSERT INTO params(position, name, layer) VALUES (?,?,?)", batch.params
                )
            if batch.param_sets:
                connection.executemany(
                    "INSERT INTO param_sets(id, positions) VALUES (?,?)", batch.param_sets
                )
            write_rows(connection, batch.statistics, batch.figures, batch.absent)
            if batch.steps:
                connection.executemany(
                    "INSERT INTO steps(row, step, layer_set, loss, total_grad_norm, flags, "
                    "loss_scale, wall_time) VALUES (?,?,?,?,?,?,?,?)",
                    batch.steps,
                )
                if batch.param_norms:
                    connection.executemany(
                        "INSERT INTO param_grad_norm(row, param_set, data) VALUES (?,?,?)",
                        batch.param_norms,
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
                if batch.warnings:
                    connection.executemany(
                        "INSERT INTO warnings(row, data) VALUES (?,?)", batch.warnings
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
            _roll_back(connection)
            raise
        self._committed_rows = self._next_row
        if finished:
            # Fold the WAL into the file, so a finished recording is one file again.
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _roll_back(connection: sqlite3.Connection) -> None:
    """Roll back after a failed statement, keeping that statement's error: SQLite has
    already rolled back by itself after some (a full disk), and a second ROLLBACK would
    replace the reason with "no transaction is active"."""
    if connection.in_transaction:
        try:
            connection.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _remove_new_file(path: Path) -> None:
    """Creating a new recording failed: leave no partial file (nor its WAL) behind."""
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        try:
            leftover.unlink()
        except OSError:
            pass
