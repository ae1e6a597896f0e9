"""The named statistics of a recording (format 3 on): the ``statistics`` table (each one's
name and what the watch said of it) and ``figures`` (one BLOB per step it was due and per
statistic: float32 values for the step's layer set). Keyed by name, so a statistic a user
adds reaches the file, and back, with no edit here.

:class:`StatisticWriter` keeps the writer thread's state (each name's position);
:class:`StatisticReader` the reader's (the names read so far) and puts a block's figures
into a :class:`~gradscope.core.history.RunHistory`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from gradscope.core.facts import StatisticInfo, StepStats
from gradscope.core.history import MISSING, RunHistory, _to_float32, named_figures
from gradscope.core.recording.format import ABSENT_TABLE, FIGURE_TABLES, FIGURES_SINCE_VERSION
from gradscope.core.recording.stored_values import StoredValueError, blob, integer, text

_INFO_COLUMNS = ("label", "combine", "every", "source")


def _info_row(position: int, info: StatisticInfo | None, name: str) -> tuple[Any, ...]:
    if info is None:  # seen in a step, never described: its name alone
        return (position, name, None, None, None, None)
    return (position, name, info.label, info.combine, int(info.every), info.source)


class StatisticWriter:
    """The writer thread's side: ``describe`` the watch's statistics (any time; a later
    description replaces an earlier one), ``pack`` a step's figures into rows."""

    def __init__(self) -> None:
        self._positions: dict[str, int] = {}
        self._infos: dict[str, StatisticInfo] = {}

    def describe(self, infos: Sequence[StatisticInfo], rows: list[tuple[Any, ...]]) -> None:
        for info in infos:
            self._infos[info.name] = info
            position = self._positions.setdefault(info.name, len(self._positions))
            rows.append(_info_row(position, info, info.name))

    def pack(
        self,
        stats: StepStats,
        row: int,
        layer_count: int,
        described: list[tuple[Any, ...]],
        figures: list[tuple[int, int, bytes]],
        absent: list[tuple[int, int, bytes]] | None = None,
    ) -> None:
        """``absent``: rows of ``absent_figures`` for the layers a statistic did not apply
        to (``stats.absent``); their cells in ``figures`` are MISSING (see format.py)."""
        for name, values in named_figures(stats).items():
            values = np.asarray(values)
            if values.shape != (layer_count,):  # not one figure per layer: not storable
                continue
            position = self._positions.get(name)
            if position is None:
                position = self._positions[name] = len(self._positions)
                described.append(_info_row(position, self._infos.get(name), name))
            packed = _to_float32(values)
            mask = stats.absent.get(name)
            if absent is not None and mask is not None and mask.shape == values.shape:
                if mask.any():
                    packed[mask] = MISSING
                    absent.append((row, position, mask.astype(np.float32).tobytes()))
            figures.append((row, position, packed.tobytes()))


def write_rows(
    connection: sqlite3.Connection,
    described: list[tuple[Any, ...]],
    figures: list[tuple[int, int, bytes]],
    absent: list[tuple[int, int, bytes]] | None = None,
) -> None:
    """Within the writer's commit transaction."""
    if described:
        connection.executemany(
            "INSERT OR REPLACE INTO statistics(position, name, label, combine, every, source) "
            "VALUES (?,?,?,?,?,?)",
            described,
        )
    if figures:
        connection.executemany("INSERT INTO figures(row, statistic, data) VALUES (?,?,?)", figures)
    if absent:
        connection.executemany(
            f"INSERT INTO {ABSENT_TABLE}(row, statistic, data) VALUES (?,?,?)", absent
        )


class StatisticReader:
    """The reader's side. ``present`` is False for a file written before format 3."""

    def __init__(self, connection: sqlite3.Connection, version: int, tables: set[str]) -> None:
        self._connection = connection
        self.present = version >= FIGURES_SINCE_VERSION
        if self.present:
            missing = [t for t in FIGURE_TABLES if t not in tables]
            if missing:
                raise StoredValueError(f"it lacks the tables {', '.join(missing)}")
        # Written before absent values were stored: none are (their cells read as stored).
        self.has_absent = self.present and ABSENT_TABLE in tables
        self.names: list[str] = []
        self.infos: dict[str, StatisticInfo] = {}

    def refresh(self) -> None:
        """Read the statistics described since the last call (and new descriptions of
        known ones: a writer describes a statistic it first saw in a step later)."""
        if not self.present:
            return
        for position, name, label, combine, every, source in self._connection.execute(
            "SELECT position, name, label, combine, every, source FROM statistics ORDER BY position"
        ):
            position = integer(position, "a statistic's position")
            name = text(name, "a statistic's name")
            if position == len(self.names):
                self.names.append(name)
            elif position > len(self.names) or self.names[position] != name:
                raise StoredValueError(f"statistic {name!r} is out of place ({position})")
            if label is None:
                continue
            self.infos[name] = StatisticInfo(
                name,
                text(label, f"statistic {name!r}'s label"),
                text(combine, f"statistic {name!r}'s combine"),
                integer(every, f"statistic {name!r}'s schedule"),
                text(source, f"statistic {name!r}'s source"),
            )

    def read_block(
        self,
        history: RunHistory,
        rows: np.ndarray,
        start: int,
        where: str,
        parameters: Sequence[Any],
        scatter: Callable[[np.ndarray, np.ndarray, np.ndarray | None], None],
    ) -> None:
        """The block's figures (file rows ``rows``, history rows from ``start``; ``where``
        selects them) into ``history``; ``scatter`` puts one statistic's values of some of
        the block's rows into its columns (the reader's, which knows the layer sets)."""
        if not self.present:
            return
        self.refresh()
        history.describe_statistics(list(self.infos.values()))
        end = start + len(rows)
        for name, which, flat in self._blocks("figures", rows, where, parameters, "values"):
            history.ensure_statistic(name)
            target = history._stats[name][start:end]
            target[:] = MISSING
            scatter(target, flat, None if len(which) == len(rows) else which)
            history._due[name][start + which] = True
        if self.has_absent:
            self._read_absent(history, rows, start, where, parameters, scatter)

    def _read_absent(
        self,
        history: RunHistory,
        rows: np.ndarray,
        start: int,
        where: str,
        parameters: Sequence[Any],
        scatter: Callable[[np.ndarray, np.ndarray, np.ndarray | None], None],
    ) -> None:
        """The block's absent cells (``absent_figures``: 1.0 where absent, laid out as the
        figures) into the history's absent masks; a statistic without any in the block has
        its masks cleared there (a block read again after a rewind)."""
        end = start + len(rows)
        found = list(self._blocks(ABSENT_TABLE, rows, where, parameters, "absent layers"))
        for name in self.names:
            mask = history.absent_matrix(name)
            if mask is not None:
                mask[start:end] = False
        for name, which, flat in found:
            history.ensure_statistic(name)
            held = history.absent_matrix(name, create=True)
            marks = np.zeros((len(rows), held.shape[1]), dtype=np.float32)
            scatter(marks, flat, None if len(which) == len(rows) else which)
            held[start:end] |= marks == 1.0

    def _blocks(
        self, table: str, rows: np.ndarray, where: str, parameters: Sequence[Any], what: str
    ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """A table of per-statistic rows (``figures``, ``absent_figures``) read for the
        block's file rows ``rows``: per statistic, its name, the positions in ``rows`` of
        the rows it has, and their values one after the other (float32)."""
        found = self._connection.execute(
            f"SELECT row, statistic, data FROM {table} WHERE {where} ORDER BY statistic, row",
            parameters,
        ).fetchall()
        by_statistic: dict[int, list[tuple[int, bytes]]] = {}
        for row, position, data in found:
            by_statistic.setdefault(integer(position, f"{table}' statistic"), []).append(
                (row, data)
            )
        for position, entries in by_statistic.items():
            if not 0 <= position < len(self.names):
                raise StoredValueError(f"{table} names a statistic the file does not describe")
            name = self.names[position]
            which = np.searchsorted(rows, np.array([r for r, _ in entries], dtype=np.int64))
            label = f"a step's {name} {what}"
            flat = np.frombuffer(b"".join(blob(b, label) for _, b in entries), dtype=np.float32)
            yield name, which, flat
