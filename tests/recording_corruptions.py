"""Damaged and crafted recordings, made from one real recording: bit flips, truncations and
SQL edits that put values outside their domain. Deterministic (a fixed seed), so a failing
case has the same name on every run. Shared by tests/test_recording_fuzz.py (report and
open) and tests/gui/test_recording_fuzz_in_app.py (File > Open recording)."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

import gradscope

STEPS = 40
NAN_STEP = 25


def make_recording(folder: Path) -> Path:
    """A real run of a small model: update ratios, an exploding step, a NaN episode (its
    origin, its events), each parameter's norm; checkpointed, so the file is whole."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    path = folder / "run.gsrec"
    with gradscope.watch(
        model,
        record=path,
        overwrite=True,
        optimizer=optimizer,
        update_ratio=True,
        explode_threshold=20.0,
    ) as watch:
        for step in range(STEPS):
            inputs = torch.randn(8, 6, generator=generator)
            targets = torch.randn(8, 1, generator=generator)
            if step == 10:
                targets = targets * 500.0  # an exploding step
            if step == NAN_STEP:
                inputs[3, 2] = float("nan")  # a NaN in the data
            optimizer.zero_grad()
            loss = (model(inputs) - targets).square().mean()
            loss.backward()
            watch.collect(loss)
            if step != NAN_STEP:
                optimizer.step()
    for leftover in ("-wal", "-shm"):
        Path(str(path) + leftover).unlink(missing_ok=True)
    return path


def _flip(offset: int, bit: int) -> Callable[[Path], None]:
    def corrupt(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[offset % len(data)] ^= 1 << bit
        path.write_bytes(bytes(data))

    return corrupt


def _truncate(size: int) -> Callable[[Path], None]:
    def corrupt(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: min(size, len(data) - 1)])

    return corrupt


def _sql(*statements: str) -> Callable[[Path], None]:
    def corrupt(path: Path) -> None:
        connection = sqlite3.connect(str(path), isolation_level=None)
        try:
            connection.execute("PRAGMA journal_mode = DELETE")
            for statement in statements:
                connection.execute(statement)
        finally:
            connection.close()

    return corrupt


def _schema_edit(old: str, new: str) -> Callable[[Path], None]:
    """Rewrite one table's CREATE text (a hand-edited or bit-rotted schema)."""

    def corrupt(path: Path) -> None:
        connection = sqlite3.connect(str(path), isolation_level=None)
        try:
            connection.execute("PRAGMA journal_mode = DELETE")
            connection.execute("PRAGMA writable_schema = ON")
            connection.execute(
                "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE sql LIKE ?",
                (old, new, f"%{old}%"),
            )
        finally:
            connection.close()

    return corrupt


# SQL edits: each puts one kind of value outside what the format stores there.
_EDITS: dict[str, tuple[str, ...]] = {
    "layer params negative": ("UPDATE layers SET params = -7 WHERE position = 1",),
    "layer params text": ("UPDATE layers SET params = 'many' WHERE position = 0",),
    "layer params real": ("UPDATE layers SET params = 2.5 WHERE position = 0",),
    "layer type blob": ("UPDATE layers SET type = x'00ff' WHERE position = 0",),
    "layer name not utf-8": ("UPDATE layers SET name = CAST(x'ff41' AS TEXT) WHERE position = 0",),
    "tree own params negative": ("UPDATE tree SET own_params = -1 WHERE position = 1",),
    "tree total params text": ("UPDATE tree SET total_params = 'x' WHERE position = 0",),
    "tree total below own": (
        "UPDATE tree SET total_params = 0, own_params = 5 WHERE position = 1",
    ),
    "tree name integer": ("UPDATE tree SET name = 12 WHERE position = 1",),
    "layer set short blob": ("UPDATE layer_sets SET positions = x'010000'",),
    "layer set text": ("UPDATE layer_sets SET positions = 'all'",),
    "layer set beyond layers": ("UPDATE layer_sets SET positions = x'63000000'",),
    "layer set negative": ("UPDATE layer_sets SET positions = x'ffffffff01000000'",),
    "step text": ("UPDATE steps SET step = 'five' WHERE row = 5",),
    "step real": ("UPDATE steps SET step = 5.5 WHERE row = 5",),
    "step blob": ("UPDATE steps SET step = x'05' WHERE row = 5",),
    "step going back": ("UPDATE steps SET step = 2 WHERE row = 30",),
    "step huge": ("UPDATE steps SET step = 9223372036854775807 WHERE row = 39",),
    "step layer set unknown": ("UPDATE steps SET layer_set = 99 WHERE row = 3",),
    "step layer set text": ("UPDATE steps SET layer_set = 'a' WHERE row = 3",),
    "flags 255": ("UPDATE steps SET flags = 255 WHERE row = 7",),
    "flags negative": ("UPDATE steps SET flags = -1 WHERE row = 7",),
    "flags text": ("UPDATE steps SET flags = 'x' WHERE row = 7",),
    "flags real": ("UPDATE steps SET flags = 1.5 WHERE row = 7",),
    "loss text": ("UPDATE steps SET loss = 'low' WHERE row = 4",),
    "loss blob": ("UPDATE steps SET loss = x'0102' WHERE row = 4",),
    "total grad norm text": ("UPDATE steps SET total_grad_norm = 'big' WHERE row = 4",),
    "total grad norm negative": ("UPDATE steps SET total_grad_norm = -3.0 WHERE row = 4",),
    "loss scale text": ("UPDATE steps SET loss_scale = 'x' WHERE row = 4",),
    "loss scale negative": ("UPDATE steps SET loss_scale = -2.0 WHERE row = 4",),
    "wall time text": ("UPDATE steps SET wall_time = 'noon' WHERE row = 4",),
    "step row deleted": ("DELETE FROM steps WHERE row = 6",),
    "grad norm short blob": ("UPDATE grad_norm SET data = x'0000' WHERE row = 2",),
    "grad norm long blob": ("UPDATE grad_norm SET data = data || x'00000000' WHERE row = 2",),
    "grad norm text": ("UPDATE grad_norm SET data = 'values' WHERE row = 2",),
    "grad norm null-free empty": ("UPDATE grad_norm SET data = x'' WHERE row = 2",),
    "grad norm row deleted": ("DELETE FROM grad_norm WHERE row = 2",),
    "grad norm negative": (
        "UPDATE grad_norm SET data = x'000000c0000000c0000000c0' WHERE row = 2",
    ),
    "max abs negative": ("UPDATE max_abs SET data = x'000040c0000040c0000040c0' WHERE row = 0",),
    "max abs short blob": ("UPDATE max_abs SET data = x'00' WHERE row = 9",),
    "weight norm text": ("UPDATE weight_norm SET data = 'w' WHERE row = 9",),
    "update ratio short blob": ("UPDATE update_ratio SET data = x'000000' WHERE row = 10",),
    "update ratio row beyond steps": (
        "INSERT INTO update_ratio(row, data) VALUES (999, x'000000000000000000000000')",
    ),
    "status code 7": ("UPDATE status SET data = x'070202' WHERE row = 3",),
    "status code 200": ("UPDATE status SET data = x'02c802' WHERE row = 3",),
    "status code 255": ("UPDATE status SET data = x'0202ff' WHERE row = 3",),
    "status short blob": ("UPDATE status SET data = x'02' WHERE row = 3",),
    "status text": ("UPDATE status SET data = 'ok' WHERE row = 3",),
    "status row deleted": ("DELETE FROM status WHERE row = 3",),
    "worst status code 9": ("UPDATE meta SET value = x'090202' WHERE key = 'worst_status'",),
    "worst status text": ("UPDATE meta SET value = 'bad' WHERE key = 'worst_status'",),
    "worst status short": ("UPDATE meta SET value = x'02' WHERE key = 'worst_status'",),
    "event step text": ("UPDATE events SET step = 'x' WHERE id = 1",),
    "event kind integer": ("UPDATE events SET kind = 4 WHERE id = 1",),
    "event message blob": ("UPDATE events SET message = x'00ff' WHERE id = 1",),
    "event layer integer": ("UPDATE events SET layer = 3 WHERE id = 1",),
    "event row text": ("UPDATE events SET row = 'r' WHERE id = 1",),
    "origin not json": ("UPDATE origins SET data = '{not json'",),
    "origin json list": ("UPDATE origins SET data = '[1, 2]'",),
    "origin blob": ("UPDATE origins SET data = x'7b7d'",),
    "origin empty object": ("UPDATE origins SET data = '{}'",),
    "rewind row of text": ("INSERT INTO rewinds(step, row) VALUES ('back', 'there')",),
    "rewind step text": ("INSERT INTO rewinds(step, row) VALUES ('x', 5)",),
    "rewind row negative": ("INSERT INTO rewinds(step, row) VALUES (3, -5)",),
    "rewind row real": ("INSERT INTO rewinds(step, row) VALUES (3, 2.5)",),
    "rewind past the end": ("INSERT INTO rewinds(step, row) VALUES (1000, 5000)",),
    "param name integer": ("UPDATE params SET name = 5 WHERE position = 0",),
    "param layer blob": ("UPDATE params SET layer = x'00' WHERE position = 0",),
    "param set short blob": ("UPDATE param_sets SET positions = x'0100'",),
    "param set beyond params": ("UPDATE param_sets SET positions = x'ff000000'",),
    "param norms short blob": ("UPDATE param_grad_norm SET data = x'0000' WHERE row = 1",),
    "param norms set unknown": ("UPDATE param_grad_norm SET param_set = 42 WHERE row = 1",),
    "param norms text": ("UPDATE param_grad_norm SET data = 'p' WHERE row = 1",),
    "format version text": ("UPDATE meta SET value = 'two' WHERE key = 'format_version'",),
    "format version newer": ("UPDATE meta SET value = 99 WHERE key = 'format_version'",),
    "format version zero": ("UPDATE meta SET value = 0 WHERE key = 'format_version'",),
    "format version negative": ("UPDATE meta SET value = -1 WHERE key = 'format_version'",),
    "format name other": ("UPDATE meta SET value = 'other' WHERE key = 'format'",),
    "created missing": ("DELETE FROM meta WHERE key = 'created'",),
    "created text": ("UPDATE meta SET value = 'today' WHERE key = 'created'",),
    "settings not json": ("UPDATE meta SET value = '{bad' WHERE key = 'settings'",),
    "settings list": ("UPDATE meta SET value = '[1]' WHERE key = 'settings'",),
    "settings blob": ("UPDATE meta SET value = x'7b7d' WHERE key = 'settings'",),
    "info source blob": ("UPDATE meta SET value = x'ff' WHERE key = 'info.source'",),
    "info device integer": ("UPDATE meta SET value = 3 WHERE key = 'info.device'",),
    "finished text": ("UPDATE meta SET value = 'yes' WHERE key = 'finished'",),
    "meta key integer": ("INSERT INTO meta(key, value) VALUES (5, 'five')",),
    "writer lock pid text": (
        "INSERT OR REPLACE INTO writer_lock(id, pid, host, token, heartbeat) "
        "VALUES (1, 'me', 'here', 't', 1.0)",
    ),
    "writer lock host blob": (
        "INSERT OR REPLACE INTO writer_lock(id, pid, host, token, heartbeat) "
        "VALUES (1, 1, x'ff00', 't', 1.0)",
    ),
    "writer lock heartbeat text": (
        "INSERT OR REPLACE INTO writer_lock(id, pid, host, token, heartbeat) "
        "VALUES (1, 1, 'here', 't', 'now')",
    ),
    "writer lock live elsewhere": (
        "INSERT OR REPLACE INTO writer_lock(id, pid, host, token, heartbeat) "
        "VALUES (1, 1, 'another-host', 't', 4102444800.0)",
    ),
    "drop status table": ("DROP TABLE status",),
    "drop meta table": ("DROP TABLE meta",),
    "drop params table": ("DROP TABLE params",),
    "drop wall time column": ("ALTER TABLE steps DROP COLUMN wall_time",),
    "drop loss scale column": ("ALTER TABLE steps DROP COLUMN loss_scale",),
    "layers renamed": ("ALTER TABLE layers RENAME TO layers_old",),
    "empty steps": ("DELETE FROM steps",),
    "empty layers": ("DELETE FROM layers",),
}


def _origin_edit(key: str, value: object) -> Callable[[Path], None]:
    """Change (or, for ``value`` ``_REMOVED``, remove) one key of every stored origin."""

    def corrupt(path: Path) -> None:
        connection = sqlite3.connect(str(path), isolation_level=None)
        try:
            connection.execute("PRAGMA journal_mode = DELETE")
            for origin_id, data in connection.execute("SELECT id, data FROM origins").fetchall():
                parsed = json.loads(data)
                if value is _REMOVED:
                    parsed.pop(key, None)
                else:
                    parsed[key] = value
                connection.execute(
                    "UPDATE origins SET data = ? WHERE id = ?", (json.dumps(parsed), origin_id)
                )
        finally:
            connection.close()

    return corrupt


_REMOVED = object()
_ORIGIN_EDITS = {
    "origin step text": ("step", "x"),
    "origin step missing": ("step", _REMOVED),
    "origin phase integer": ("phase", 3),
    "origin line text": ("line", "ten"),
    "origin details list": ("details", []),
    "origin kind missing": ("kind", _REMOVED),
    "origin module list": ("module", ["a"]),
}


# The SQL edits after which the file is still a readable recording: SQLite's column
# affinity turns an integer into text where text belongs, tables and columns added within
# the format's version may be absent, and the rest are values a real run can write.
MAY_OPEN = frozenset(
    {
        "tree name integer",
        "event kind integer",
        "event layer integer",
        "event row text",
        "param name integer",
        "meta key integer",
        "finished text",
        "writer lock live elsewhere",
        "drop params table",
        "drop wall time column",
        "empty steps",
        "step going back",
        "step huge",
        "worst status short",
        "rewind past the end",
    }
)


def corruptions(seed: int = 34) -> Iterator[tuple[str, Callable[[Path], None]]]:
    """About 200 named corruptions: the SQL edits above, truncations and bit flips (a
    third of them in the first pages, where the schema text and the meta table live)."""
    yield from ((name, _sql(*statements)) for name, statements in _EDITS.items())
    yield from ((name, _origin_edit(*edit)) for name, edit in _ORIGIN_EDITS.items())
    yield "schema: steps loses its flags", _schema_edit("flags INTEGER NOT NULL, ", "")
    yield "schema: text not utf-8", _schema_edit("CREATE TABLE tree", "CREATE TABLE \xfftree")
    yield "schema: garbage", _schema_edit("CREATE TABLE events(", "CREATE TABLE events((")
    for size in (0, 15, 16, 50, 99, 100, 101, 1024, 4095, 4096, 4097, 8192):
        yield f"truncated to {size} bytes", _truncate(size)
    for fraction in range(1, 10):
        yield f"truncated to {fraction}/10", _truncate_fraction(fraction / 10)
    generator = random.Random(seed)
    for number in range(25):
        offset = generator.randrange(100, 3 * 4096)
        yield (
            f"bit flip {number} in the first pages at {offset}",
            _flip(offset, generator.randrange(8)),
        )
    for number in range(50):
        offset = generator.randrange(0, 2**24)
        yield f"bit flip {number} at {offset} (mod size)", _flip(offset, generator.randrange(8))


def _truncate_fraction(fraction: float) -> Callable[[Path], None]:
    def corrupt(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * fraction)])

    return corrupt


def corrupted_copies(original: Path, folder: Path) -> Iterator[tuple[str, Path]]:
    """Each corruption applied to its own copy of ``original`` (in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for number, (name, corrupt) in enumerate(corruptions()):
        copy = folder / f"case{number:03d}.gsrec"
        shutil.copyfile(original, copy)
        corrupt(copy)
        for leftover in ("-wal", "-shm", "-journal"):
            Path(str(copy) + leftover).unlink(missing_ok=True)
        yield name, copy
