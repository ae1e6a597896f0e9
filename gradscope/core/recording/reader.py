"""Reading (:class:`RecordingReader`): ``load()`` returns the module tree and a
:class:`~gradscope.core.history.RunHistory`, optionally decimated (every k-th step plus every
step with an event); ``read_new_steps(history)`` appends what was committed since the last
read (follow mode); ``read_statistic()`` reads one statistic over a range of steps at full
resolution. Reads run in short read transactions, which never block the writer.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import GradScopeError
from gradscope.core.facts import StatisticInfo
from gradscope.core.history import (
    MISSING,
    STATISTICS,
    STATUS_MISSING,
    RunHistory,
)
from gradscope.core.module_tree import ModuleTree
from gradscope.core.recording.format import (
    _DENSE_TABLES,
    _FLAG_LOSS_GIVEN,
    _FLAG_LOSS_NONFINITE,
    _FLAG_SCALE_COLLAPSED,
    _FLAG_SKIPPED,
    _FLAG_UNWATCHED_NONFINITE,
    OPTIONAL_TABLES,
    WARNING_TABLE,
    _check_header,
    _connect,
    _damaged,
    _read_meta,
    status_codes,
)
from gradscope.core.recording.lock import _lock_is_held
from gradscope.core.recording.named_statistics import StatisticReader
from gradscope.core.recording.stored_values import (
    StoredValueError,
    blob,
    early_warning,
    event,
    layer_row,
    no_negative,
    origin,
    rewind_row,
    status_codes_known,
    step_rows,
    text,
    tree_row,
    writer_lock_row,
)

# What building the history from a file's rows can raise when the file holds something
# else than the format says (the stored_values checks catch most before numpy does; a
# UnicodeDecodeError, a ValueError, is SQLite's message about a schema that is no UTF-8).
_DAMAGE = (ValueError, KeyError, IndexError, TypeError, AttributeError)
_KNOWN_FLAGS = (
    _FLAG_LOSS_GIVEN
    | _FLAG_LOSS_NONFINITE
    | _FLAG_UNWATCHED_NONFINITE
    | _FLAG_SKIPPED
    | _FLAG_SCALE_COLLAPSED
)
# What a recording opens decimated to (about this many steps): the app's first view, and so
# what `gradscope open` checks before any window (see check_recording).
FIRST_VIEW_ROWS = 5000


def check_recording(path: str | os.PathLike[str]) -> RunHistory:
    """Read what the app reads when it opens ``path`` and return its first view's history: a
    :class:`GradScopeError` with one line when the file is no readable recording
    (``gradscope open`` says it before any window)."""
    with RecordingReader(path, snapshot=True) as reader:
        _, history = reader.load(max_rows=FIRST_VIEW_ROWS)
        reader.is_live()
    return history


# -- reading ------------------------------------------------------------------------------
def _settings_of(text: Any, path: Path) -> dict[str, Any]:
    """The recorded run settings: a JSON object (or nothing)."""
    if text is None or text == "":
        return {}
    if not isinstance(text, str):
        raise GradScopeError(f"{path} is damaged: its run settings are no text")
    try:
        settings = json.loads(text)
    except (TypeError, ValueError) as error:
        raise GradScopeError(
            f"{path} is damaged: its run settings are not valid JSON ({error})"
        ) from None
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise GradScopeError(
            f"{path} is damaged: its run settings are a JSON {type(settings).__name__}, "
            "not an object"
        )
    return settings


class RecordingReader:
    """Read a recording, also while another process writes it.

    ``load()`` -> ``(tree, history)``; then ``read_new_steps(history)`` appends what was
    committed since (follow mode) and ``is_live()`` says whether a writer is still at it.
    Every problem with the file is a :class:`GradScopeError` with one clear message.
    A reader holds one SQLite connection: use it from one thread at a time (the app's
    worker, say), or give each thread its own reader.
    """

    def __init__(self, path: str | os.PathLike[str], *, snapshot: bool = False) -> None:
        """``snapshot``: the file is read as it is now and not followed (``gradscope
        report``, the check before the app opens a file): reading a finished recording then
        leaves nothing beside it."""
        self.path = Path(path)
        _check_header(self.path)
        try:
            self._connection = _connect(self.path, read_only=True, snapshot=snapshot)
        except sqlite3.Error as error:
            raise GradScopeError(f"cannot open the recording {self.path}: {error}") from None
        except UnicodeDecodeError:  # SQLite quoting a damaged schema in its message
            raise _damaged(self.path, ValueError("its schema text is not UTF-8")) from None
        try:
            meta = _read_meta(self._connection, self.path)
            self.format_version: int = meta["format_version"]
            self._created = meta.get("created")
            if not isinstance(self._created, (int, float)) or isinstance(self._created, bool):
                # Without it, a reader cannot tell this file from a new one written over it.
                raise StoredValueError("it has no creation time (meta.created)")
            self.settings: dict[str, Any] = _settings_of(meta.get("settings"), self.path)
            # Read only by a decimated load, checked at once: every load agrees on a file.
            worst = meta.get("worst_status")
            status_codes_known(
                status_codes(
                    np.frombuffer(blob(worst or b"", "meta.worst_status"), dtype=np.uint8),
                    self.format_version,
                ),
                "meta.worst_status",
            )
            for step, row in self._connection.execute("SELECT step, row FROM rewinds"):
                rewind_row(step, row)
            self.info: dict[str, str] = {
                key[5:]: text(value, f"meta.{key}")
                for key, value in meta.items()
                if isinstance(key, str) and key.startswith("info.")
            }
            tree_rows = [
                tree_row(row)
                for row in self._connection.execute(
                    "SELECT name, type, own_params, total_params FROM tree ORDER BY position"
                )
            ]
            self.tree: ModuleTree | None = ModuleTree.from_rows(tree_rows) if tree_rows else None
            # What a file written before them lacks (see format.py): then the app offers
            # no wall-clock axis and no per-parameter norms.
            step_columns = {row[1] for row in self._connection.execute("PRAGMA table_info(steps)")}
            self.has_wall_time = "wall_time" in step_columns
            tables = {
                name
                for (name,) in self._connection.execute(
                    "SELECT name FROM sqlite_master WHERE type='table'"
                )
            }
            self.has_parameter_norms = all(t in tables for t in OPTIONAL_TABLES)
            # A file written before them has no early warnings stored (their events only).
            self._has_warnings = WARNING_TABLE in tables
            self._statistics = StatisticReader(self._connection, self.format_version, tables)
        except (sqlite3.DatabaseError, *_DAMAGE) as error:
            self._connection.close()
            raise _damaged(self.path, error) from None
        except BaseException:
            self._connection.close()
            raise
        self.loss_recorded = np.zeros(0, dtype=bool)
        self.decimation = 1
        self._last_row = -1
        self._last_event = 0
        self._last_rewind = 0
        self._last_origin = 0
        self._last_warning = 0
        self._layer_names: list[str] = []
        self._layer_types: list[str] = []
        self._layer_params: list[int] = []
        self._sets: dict[int, np.ndarray] = {}
        self._param_names: list[str] = []
        self._param_layers: list[str] = []
        self._param_sets: dict[int, np.ndarray] = {}

    @property
    def looked_for_warnings(self) -> bool:
        """Whether the run looked for early warnings (``early_warnings=True``): then
        ``RunHistory.warnings`` holds all it gave, none if it is empty. A watch's recording
        says so in its info; the app's, in its run settings."""
        said = self.info.get("early_warnings") == "1" or self.settings.get("early_warnings")
        return self._has_warnings and bool(said)

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
        except (sqlite3.DatabaseError, *_DAMAGE) as error:
            raise _damaged(self.path, error) from None

    def is_live(self) -> bool:
        """True while a writer holds the recording (and is alive)."""
        row = self._query("SELECT pid, host, heartbeat FROM writer_lock WHERE id = 1")
        if not row:
            return False
        try:
            lock = writer_lock_row(*row[0])
        except StoredValueError as error:
            raise _damaged(self.path, error) from None
        return _lock_is_held(*lock)

    def is_finished(self) -> bool:
        """True when the writer closed it properly (False after a crash, or while live)."""
        return self._query("SELECT value FROM meta WHERE key = 'finished'") == [(1,)]

    def row_count(self) -> int:
        """Steps recorded so far (committed ones)."""
        found = self._query("SELECT MAX(row) FROM steps")
        return 0 if found[0][0] is None else int(found[0][0]) + 1

    @property
    def statistic_infos(self) -> list[StatisticInfo]:
        """What the watch said of the named statistics the recording holds (labels,
        schedules); empty for a file written before statistics were stored by name."""
        try:
            self._statistics.refresh()
        except (sqlite3.DatabaseError, *_DAMAGE) as error:
            raise _damaged(self.path, error) from None
        return list(self._statistics.infos.values())

    @property
    def layer_names(self) -> list[str]:
        """The recorded layers, in order of first appearance (history columns)."""
        try:
            self._refresh_layers()
        except (sqlite3.DatabaseError, *_DAMAGE) as error:
            raise _damaged(self.path, error) from None
        return list(self._layer_names)

    # -- loading ----------------------------------------------------------------------
    def load(self, max_rows: int | None = None) -> tuple[ModuleTree | None, RunHistory]:
        """The module tree (None when the writer stored none) and a history of the steps
        committed so far. With ``max_rows``, a longer recording is decimated: every k-th
        step, plus every step with an event (onsets, the origin) and the last step; each
        layer's worst status still covers every step."""
        history = RunHistory()
        self._last_row, self._last_event, self._last_origin = -1, 0, 0
        self._last_warning = 0
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
        following = self._last_origin
        self._last_origin = 0  # the window's history gets every origin too
        try:
            self._read(history, stride, (max(0, start_row), stop))
        finally:
            self._last_origin = following
        return history

    def _read(self, history: RunHistory, stride: int, window: tuple[int, int] | None = None) -> int:
        connection = self._connection
        try:
            connection.execute("BEGIN")  # one snapshot across all tables
            try:
                added = self._read_block(history, stride, window)
            finally:
                connection.execute("COMMIT")
        except (sqlite3.DatabaseError, *_DAMAGE) as error:
            raise _damaged(self.path, error) from None
        return added

    def _refresh_layers(self) -> None:
        connection = self._connection
        for _position, name, type_name, params in connection.execute(
            "SELECT position, name, type, params FROM layers WHERE position >= ? ORDER BY position",
            (len(self._layer_names),),
        ):
            name, type_name, params = layer_row(name, type_name, params)
            self._layer_names.append(name)
            self._layer_types.append(type_name)
            self._layer_params.append(params)
        known = max(self._sets, default=-1)
        for set_id, positions in connection.execute(
            "SELECT id, positions FROM layer_sets WHERE id > ? ORDER BY id", (known,)
        ):
            stored = np.frombuffer(blob(positions, "a layer set's positions"), dtype=np.int32)
            if len(stored) and not (0 <= stored.min() and stored.max() < len(self._layer_names)):
                raise StoredValueError("a layer set names layers the recording does not have")
            self._sets[int(set_id)] = stored
        if not self.has_parameter_norms:
            return
        for _position, name, layer in connection.execute(
            "SELECT position, name, layer FROM params WHERE position >= ? ORDER BY position",
            (len(self._param_names),),
        ):
            self._param_names.append(text(name, "a parameter's name"))
            self._param_layers.append(text(layer, f"parameter {name!r}'s layer"))
        known = max(self._param_sets, default=-1)
        for set_id, positions in connection.execute(
            "SELECT id, positions FROM param_sets WHERE id > ? ORDER BY id", (known,)
        ):
            stored = np.frombuffer(blob(positions, "a parameter set's positions"), dtype=np.int32)
            if len(stored) and not (0 <= stored.min() and stored.max() < len(self._param_names)):
                raise StoredValueError("a parameter set names parameters the file does not have")
            self._param_sets[int(set_id)] = stored

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
        scale_column = "loss_scale" if self.format_version >= 2 else "NULL"
        wall_column = "wall_time" if self.has_wall_time else "NULL"
        columns_read = (
            f"row, step, layer_set, loss, total_grad_norm, flags, {scale_column}, {wall_column}"
        )
        self._check_steps(columns_read, scale_column, wall_column, selection)
        step_rows = connection.execute(
            f"SELECT {columns_read} FROM steps WHERE {selection[0]} ORDER BY row",
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
        warnings: list[Any] = []
        if self._has_warnings:
            where, bounds = (span, (first_row, stop_row))
            if follow:
                where, bounds = "id > ?", (self._last_warning,)
            warnings = connection.execute(
                f"SELECT id, data FROM warnings WHERE {where} ORDER BY id", bounds
            ).fetchall()
        origin_data = None
        if history.first_nonfinite is None:
            found = connection.execute("SELECT data FROM origins ORDER BY id LIMIT 1").fetchone()
            origin_data = found[0] if found else None
        if not step_rows:
            self._add_events(history, events, warnings, origin_data, follow)
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
        history.skipped[start:end] = (flags & _FLAG_SKIPPED) != 0
        history.loss_scale[start:end] = [r[6] or 0.0 for r in step_rows]
        history.wall_time[start:end] = [np.nan if r[7] is None else r[7] for r in step_rows]

        unknown = [int(s) for s in np.unique(set_ids) if int(s) not in self._sets]
        if unknown:
            raise StoredValueError(f"a step names layer set {unknown[0]}, which it does not hold")
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
            what = f"a step's {name} values"
            flat = np.frombuffer(b"".join(blob(b, what) for (b,) in blobs), dtype=dtype)
            del blobs
            if name == "status":
                flat = status_codes_known(status_codes(flat, self.format_version), what)
                target = history._status[start:end]
                if not covers_all:
                    target[:] = STATUS_MISSING
            else:
                no_negative(flat, what)
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
            what = "a step's update_ratio values"
            flat = np.frombuffer(b"".join(blob(b, what) for _, b in sparse), dtype=np.float32)
            no_negative(flat, what)
            scatter(ratios, flat, None if len(which) == n else which)

        if self.has_parameter_norms:
            self._read_parameter_norms(history, rows, start, where, parameters)
        self._statistics.read_block(history, rows, start, where, parameters, scatter)

        block_status = history._status[start:end][:, columns]
        if stride == 1:
            seen = np.where(block_status == STATUS_MISSING, 0, block_status).max(axis=0)
        else:  # skipped steps count too: the writer keeps each layer's worst status
            stored = connection.execute(
                "SELECT value FROM meta WHERE key = 'worst_status'"
            ).fetchone()
            worst_blob = blob(stored[0] or b"", "meta.worst_status")
            worst = np.frombuffer(worst_blob, dtype=np.uint8)[: len(columns)]
            worst = status_codes(worst, self.format_version)
            seen = np.zeros(len(columns), dtype=np.uint8)
            seen[: len(worst)] = worst
        history.worst_status[columns] = np.maximum(history.worst_status[columns], seen)
        # Let a later RunHistory.append continue the onsets where the recording stopped.
        for set_id in sorted(groups, key=lambda s: groups[s][0][-1]):
            members, layer_columns = groups[set_id]
            last_row = history._status[start + members[-1]]
            names = [history.layer_names[column] for column in layer_columns.tolist()]
            history.onsets.set(names, last_row[layer_columns])
        history.count = end
        if follow:
            self.loss_recorded = np.concatenate([self.loss_recorded, loss_given])
            self._last_row = int(rows[-1])
        self._add_events(history, events, warnings, origin_data, follow)
        return n

    def _check_steps(
        self, columns_read: str, scale_column: str, wall_column: str, selection: tuple
    ) -> None:
        """The steps rows a read takes hold only what the format stores there: found in
        SQLite (no Python loop over rows), then said by stored_values on the row found."""
        numbers = "'real', 'integer', 'null'"
        bad = (
            "typeof(row) != 'integer' OR typeof(step) != 'integer' "
            "OR typeof(layer_set) != 'integer' OR typeof(flags) != 'integer' "
            f"OR flags < 0 OR (flags & ~{_KNOWN_FLAGS}) != 0 "
            f"OR typeof(loss) NOT IN ({numbers}) "
            f"OR typeof(total_grad_norm) NOT IN ({numbers}) OR total_grad_norm < 0 "
            f"OR typeof({scale_column}) NOT IN ({numbers}) OR {scale_column} < 0 "
            f"OR typeof({wall_column}) NOT IN ({numbers})"
        )
        found = self._connection.execute(
            f"SELECT {columns_read} FROM steps WHERE ({selection[0]}) AND ({bad}) LIMIT 1",
            selection[1],
        ).fetchone()
        if found is not None:
            step_rows([found], _KNOWN_FLAGS)
            raise StoredValueError(f"row {found[0]} holds a value the format does not store")

    def _read_parameter_norms(
        self,
        history: RunHistory,
        rows: np.ndarray,
        start: int,
        where: str,
        parameters: Sequence[Any],
    ) -> None:
        """Each parameter's norm at the block's rows (file rows ``rows``, history rows from
        ``start``), in runs of rows that share a parameter set."""
        found = self._connection.execute(
            f"SELECT row, param_set, data FROM param_grad_norm WHERE {where} ORDER BY row",
            parameters,
        ).fetchall()
        if not found:
            return
        norms = history.parameter_norms
        history_rows = start + np.searchsorted(rows, [r for r, _, _ in found])
        run_start = 0
        for i in range(1, len(found) + 1):
            if i < len(found) and found[i][1] == found[run_start][1]:
                continue
            positions = self._param_sets[int(found[run_start][1])]
            names = [self._param_names[p] for p in positions.tolist()]
            layers = [self._param_layers[p] for p in positions.tolist()]
            columns = norms.ensure(names, layers)
            what = "a step's parameter norms"
            flat = np.frombuffer(
                b"".join(blob(b, what) for _, _, b in found[run_start:i]), dtype=np.float32
            )
            no_negative(flat, what)
            if len(flat) != (i - run_start) * len(names):
                raise ValueError("stored parameter norms do not match their parameters")
            norms.add(
                history_rows[run_start:i].astype(np.int64),
                columns,
                flat.reshape(i - run_start, len(names)),
            )
            run_start = i

    def _follow_rewinds(self, history: RunHistory) -> None:
        """The writer rewound (and deleted rows this history may hold): rewind too."""
        connection = self._connection
        rewinds = connection.execute(
            "SELECT id, step, row FROM rewinds WHERE id > ? ORDER BY row LIMIT 1",
            (self._last_rewind,),
        ).fetchone()
        if rewinds is None:
            return
        step, cut_row = rewind_row(rewinds[1], rewinds[2])
        history.rewind_to(step)
        self.loss_recorded = self.loss_recorded[: history.count]
        self._last_row = min(self._last_row, int(cut_row) - 1)
        kept = connection.execute("SELECT MAX(id) FROM events WHERE row < ?", (cut_row,))
        self._last_event = kept.fetchone()[0] or 0
        if self._has_warnings:
            kept = connection.execute("SELECT MAX(id) FROM warnings WHERE row < ?", (cut_row,))
            self._last_warning = kept.fetchone()[0] or 0
        self._last_rewind = connection.execute("SELECT MAX(id) FROM rewinds").fetchone()[0]

    def _add_events(
        self,
        history: RunHistory,
        events: list[Any],
        warnings: list[Any],
        origin_data: str | None,
        follow: bool,
    ) -> None:
        for event_id, step, kind, layer, message in events:
            history.events.append(event(step, kind, layer, message))
            if follow:
                self._last_event = int(event_id)
        for warning_id, data in warnings:
            history.warnings.append(early_warning(data))
            if follow:
                self._last_warning = int(warning_id)
        if origin_data is not None and history.first_nonfinite is None:
            history.first_nonfinite = origin(origin_data)
        # Every episode's origin, each once (also when following a live recording).
        for origin_id, data in self._connection.execute(
            "SELECT id, data FROM origins WHERE id > ? ORDER BY id", (self._last_origin,)
        ).fetchall():
            history.origins.append(origin(data))
            self._last_origin = int(origin_id)

    # -- lazy reading -----------------------------------------------------------------
    def read_statistic(
        self,
        statistic: str,
        layer: str,
        start_row: int = 0,
        stop_row: int | None = None,
        stride: int = 1,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One layer's ``statistic`` (or ``"status"``, or a named statistic) over rows
        ``start_row:stop_row:stride`` at full resolution, without loading anything else:
        ``(steps, values)``, with ``MISSING`` (``STATUS_MISSING`` for status) where the layer
        was not watched (or a named statistic not due)."""
        joined = f"{statistic} AS v ON v.row = s.row"
        if statistic not in (*STATISTICS, "status"):
            try:
                self._statistics.refresh()
            except (sqlite3.DatabaseError, *_DAMAGE) as error:
                raise _damaged(self.path, error) from None
            known = (*STATISTICS, "status", *self._statistics.names)
            if statistic not in known:
                raise GradScopeError(f"unknown statistic {statistic!r}; one of {', '.join(known)}")
            position = self._statistics.names.index(statistic)
            joined = f"figures AS v ON v.row = s.row AND v.statistic = {position}"
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
                        f"JOIN {joined} "
                        f"WHERE s.layer_set = ? AND {window} ORDER BY s.row",
                        (int(hits[0]) * size + 1, size, set_id, *bounds),
                    ).fetchall()
                    if found:
                        rows = np.fromiter((r for r, _ in found), dtype=np.int64, count=len(found))
                        what = f"a step's {statistic} values"
                        flat = np.frombuffer(b"".join(blob(b, what) for _, b in found), dtype=dtype)
                        if statistic == "status":
                            flat = status_codes_known(status_codes(flat, self.format_version), what)
                        else:
                            no_negative(flat, what)
                        if len(flat) != len(found):
                            raise ValueError(f"{statistic} values do not match their layers")
                        values[np.searchsorted(table[:, 0], rows)] = flat
            finally:
                connection.execute("COMMIT")
        except (sqlite3.DatabaseError, *_DAMAGE) as error:
            raise _damaged(self.path, error) from None
        return table[:, 1].copy(), values
