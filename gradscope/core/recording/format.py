"""The recording file format: tables, constants, opening and checking a file.

Format (``FORMAT_VERSION`` in the ``meta`` table; a reader refuses newer versions):

- ``meta``: format name and version, creation time, GradScope version, source, device, the
  caller's run settings (JSON), whether the writer finished, and the worst status seen per
  layer (a uint8 BLOB, so a decimated load still knows every layer's worst step);
- ``tree``: the module tree rows (``ModuleTree.rows()``), so no model is needed to show it;
- ``layers`` (watched layers: name, type, parameter count) and ``layer_sets`` (the layers
  each step covers, an int32 BLOB of layer positions; a new set when the watched layers
  change during a run);
- ``steps``: one row per recorded step (step number, layer set, loss, total grad norm, flags,
  the loss scaler's scale, NULL without one, and ``wall_time``: when the watch collected the
  step, seconds since the epoch)
  and one table per statistic (``grad_norm``, ``max_abs``, ``weight_norm``, ``update_ratio``,
  ``status``) holding one BLOB per step: the step's values for its layer set as packed
  little-endian float32 (uint8 for status). NaN/Inf are stored as they are. Tables apart let
  a reader fetch one statistic without touching the others. NaN/Inf counts are sparse
  (``nonfinite_counts``, int64, only steps that have any);
- ``params`` (each watched parameter: name and the layer it counts for), ``param_sets``
  (the parameters each step covers, like ``layer_sets``) and ``param_grad_norm`` (one BLOB
  per step: each parameter's gradient norm as float32, ``StepStats.param_grad_norm``);
- ``events`` (status onsets, the NaN/Inf origin, gaps) and ``origins`` (the first non-finite
  origin's full details as JSON);
- ``statistics`` (each named statistic beyond the built-in ones: name, and what the watch
  said of it, ``StatisticInfo``: label, combine, every, source; NULL where it said nothing)
  and ``figures`` (one BLOB per step and statistic, on the steps it was due only: its
  values for the step's layer set as float32, like the tables above). A new statistic is
  a row of ``statistics``, never a schema change (version 3); ``absent_figures`` (added
  within version 3): where a statistic was due but did not apply to a layer
  (``StepStats.absent``), one BLOB per such step and statistic, laid out as its
  ``figures`` BLOB, 1.0 at the absent layers and 0.0 elsewhere; the ``figures`` BLOB holds
  -1 (the history's MISSING, what the plots skip) there, so a GradScope that predates the
  table draws a gap there too, though its reports show -1;
- ``warnings``: the early warnings (``StepStats.warnings``, ``facts.EarlyWarning`` as JSON),
  each also an ``events`` row of kind "warning" (its ``describe()``), as an origin is;
- ``rewinds``: where the app rewound the run (``RecordingWriter.rewind_to``); the abandoned
  branch's rows are deleted, so step numbers never decrease from row to row, and a
  follower rewinds its history when it sees a new entry.

Added within version 2 (a reader checks for them, a file without them opens as before, and an
older GradScope reads a file with them, ignoring them): ``steps.wall_time`` and the three
parameter tables; within version 3, ``warnings`` (an older GradScope shows their events)
and ``absent_figures``.
Nothing in them changes what the older columns mean, so the version stays.

Nothing is pickled: opening a recording runs no code. SQLite's WAL mode lets readers read
while the writer appends and a committed transaction survives the writer being killed
(``synchronous=NORMAL``: an application crash loses nothing committed; a power cut may lose
the last commits, never the file's consistency).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import GradScopeError
from gradscope.core.history import STATUS_MISSING

FORMAT_NAME = "gradscope-recording"
# 2: status codes gained "frozen" (0) and "no gradient" (1) below ok (2), so that the worst
# status is still the largest code, and "skipped" (3) for steps the loss scaler skips; version
# 1's codes 0-3 (ok, vanishing, exploding, nonfinite) are read as 2, 4, 5, 6.
# 3: statistics stored by name (``statistics`` and ``figures``); versions 1 and 2 are read as
# before, without them.
FORMAT_VERSION = 3
SUFFIX = ".gsrec"
ORIGIN_WAIT_SECONDS = 5.0

_SQLITE_MAGIC = b"SQLite format 3\x00"
_FLAG_LOSS_GIVEN = 1
_FLAG_LOSS_NONFINITE = 2
_FLAG_UNWATCHED_NONFINITE = 4
_FLAG_SKIPPED = 8  # the loss scaler skips this step (its scaled gradients overflowed)
_FLAG_SCALE_COLLAPSED = 16
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
    loss REAL, total_grad_norm REAL, flags INTEGER NOT NULL, loss_scale REAL, wall_time REAL);
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
CREATE TABLE warnings(id INTEGER PRIMARY KEY, row INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE rewinds(id INTEGER PRIMARY KEY, step INTEGER NOT NULL, row INTEGER NOT NULL);
CREATE TABLE params(
    position INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, layer TEXT NOT NULL);
CREATE TABLE param_sets(id INTEGER PRIMARY KEY, positions BLOB NOT NULL);
CREATE TABLE param_grad_norm(
    row INTEGER PRIMARY KEY, param_set INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE statistics(
    position INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, label TEXT, combine TEXT,
    every INTEGER, source TEXT);
CREATE TABLE figures(
    row INTEGER NOT NULL, statistic INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (row, statistic)) WITHOUT ROWID;
CREATE TABLE absent_figures(
    row INTEGER NOT NULL, statistic INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (row, statistic)) WITHOUT ROWID;
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
# Tables a file written before they were added lacks (see the module docstring).
OPTIONAL_TABLES = ("params", "param_sets", "param_grad_norm")
# The early warnings' table, added within version 3 (a file without it has none stored).
WARNING_TABLE = "warnings"
# The named statistics' tables: in every file from version 3 on, in none before.
FIGURE_TABLES = ("statistics", "figures")
# Where a named statistic did not apply, added within version 3 (a file without it has no
# absent values).
ABSENT_TABLE = "absent_figures"
FIGURES_SINCE_VERSION = 3
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
    WARNING_TABLE,
    "param_grad_norm",
    "figures",
    ABSENT_TABLE,
)


# -- the file -----------------------------------------------------------------------------
def _connect(path: Path, *, read_only: bool, snapshot: bool = False) -> sqlite3.Connection:
    """``snapshot``: read once as the file is now, never followed. With no ``-wal`` file
    beside it no writer is connected (a WAL-mode connection keeps one until it closes), so
    the file is opened immutable: a read-only connection would otherwise create ``-wal``
    and ``-shm`` files that it cannot remove, left behind by a command that only read."""
    if read_only:
        uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro"
        if snapshot and not Path(f"{path}-wal").exists():
            uri += "&immutable=1"
        connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA query_only = 1")
        try:
            connection.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.OperationalError as error:
            if "unable to open" not in str(error):
                raise
            # A WAL-mode file on read-only storage (an archive, a read-only mount): SQLite
            # cannot create the shared-memory file it reads a WAL through. Nothing can write
            # there either, so the file is read as it is.
            connection.close()
            connection = sqlite3.connect(
                uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False
            )
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
    status = path.stat()
    if not stat.S_ISREG(status.st_mode):
        # Opening a FIFO (or a device) to read its header would block until someone writes.
        raise GradScopeError(f"{path} is not a regular file, so not a recording")
    size = status.st_size
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


# How much of SQLite's or a check's own words a "damaged" message quotes.
_REASON_CHARACTERS = 200


def _damaged(path: Path, error: Exception) -> GradScopeError:
    return GradScopeError(
        f"{path} is damaged (truncated or corrupt): {_one_line(str(error))}; "
        "steps up to the damage may be readable by an older copy"
    )


def _one_line(reason: str) -> str:
    """A reason fit for one line: SQLite quotes the damaged bytes themselves (newlines,
    control characters, undecodable text), so only printable characters are kept, and
    not too many of them."""
    printable = "".join(c if c.isprintable() else " " for c in reason.replace("\ufffd", " "))
    printable = " ".join(printable.split())
    if len(printable) > _REASON_CHARACTERS:
        printable = printable[: _REASON_CHARACTERS - 3].rstrip() + "..."
    return printable


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
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _damaged(path, ValueError(f"no format version (meta.format_version is {version!r})"))
    if version > FORMAT_VERSION:
        raise GradScopeError(
            f"{path} was written by a newer GradScope (recording format {version}; this "
            f"GradScope reads up to format {FORMAT_VERSION}); update GradScope to open it"
        )
    missing = [t for t in _TABLES if t not in tables]
    if missing:
        raise _damaged(path, ValueError(f"missing tables {', '.join(missing)}"))
    return meta


def status_codes(raw: np.ndarray, version: int) -> np.ndarray:
    """Status codes as this GradScope numbers them, from a recording of format ``version``."""
    if version >= 2:
        return raw
    return np.where(raw == STATUS_MISSING, raw, np.array([2, 4, 5, 6], np.uint8)[raw % 4])
