"""Checking what a recording's rows hold before the reader builds anything from them.

SQLite columns take any type, so a damaged or hand-edited file can hold text where a BLOB
belongs, a JSON list where an object belongs, or an origin without its step. Each function
here returns the value as the reader needs it, or raises :class:`StoredValueError` saying
which value is wrong; the reader turns that into its one-line "is damaged" message.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from gradscope.core.facts import STATUS_NAMES, EarlyWarning, Origin
from gradscope.core.history import MISSING, Event


class StoredValueError(ValueError):
    """A value in the file is not what the format stores there."""


def _kind(value: Any) -> str:
    if value is None:
        return "NULL"
    return {bytes: "a BLOB", str: "text", int: "an integer", float: "a real number"}.get(
        type(value), type(value).__name__
    )


def blob(value: Any, what: str) -> bytes:
    """A BLOB column's bytes."""
    if not isinstance(value, bytes):
        raise StoredValueError(f"{what} is {_kind(value)}, not a BLOB")
    return value


def integer(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise StoredValueError(f"{what} is {_kind(value)}, not an integer")
    return value


def text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise StoredValueError(f"{what} is {_kind(value)}, not text")
    return value


def optional_text(value: Any, what: str) -> str | None:
    return None if value is None else text(value, what)


def number(value: Any, what: str) -> float | None:
    """A REAL column (NULL stands for NaN or "not given")."""
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise StoredValueError(f"{what} is {_kind(value)}, not a number")
    return float(value)


def count(value: Any, what: str) -> int:
    """An integer that counts something (parameters, a row number): never negative."""
    found = integer(value, what)
    if found < 0:
        raise StoredValueError(f"{what} is {found}, below 0")
    return found


def layer_row(name: Any, type_name: Any, params: Any) -> tuple[str, str, int]:
    return (
        text(name, "a layer's name"),
        text(type_name, f"layer {name!r}'s type"),
        count(params, f"layer {name!r}'s parameter count"),
    )


def tree_row(row: tuple[Any, ...]) -> tuple[str, str, int, int]:
    name, type_name, own, total = row
    own = count(own, f"module {name!r}'s parameter count")
    total = count(total, f"module {name!r}'s total parameter count")
    if total < own:
        raise StoredValueError(
            f"module {name!r} has {own} parameters of its own but {total} in all"
        )
    return (
        text(name, "a module's name in the tree"),
        text(type_name, f"module {name!r}'s type"),
        own,
        total,
    )


def step_rows(rows: list[tuple[Any, ...]], known_flags: int) -> None:
    """The ``steps`` rows a read fetched (row, step, layer_set, loss, total_grad_norm,
    flags, loss_scale, wall_time): integers where the format stores integers, numbers (or
    NULL) where it stores reals, no flag bit the format does not define, no negative norm
    or loss scale."""
    for row, step, layer_set, loss, total, flags, scale, wall_time in rows:
        count(row, "a step's row number")
        integer(step, f"row {row}'s step number")
        integer(layer_set, f"row {row}'s layer set")
        integer(flags, f"row {row}'s flags")
        if flags < 0 or flags & ~known_flags:
            raise StoredValueError(f"row {row}'s flags are {flags}, beyond those the format sets")
        number(loss, f"row {row}'s loss")
        number(wall_time, f"row {row}'s wall-clock time")
        if (number(total, f"row {row}'s total gradient norm") or 0.0) < 0:
            raise StoredValueError(f"row {row}'s total gradient norm is {total}, below 0")
        if (number(scale, f"row {row}'s loss scale") or 0.0) < 0:
            raise StoredValueError(f"row {row}'s loss scale is {scale}, below 0")


def rewind_row(step: Any, row: Any) -> tuple[int, int]:
    """A ``rewinds`` row: the step rewound to and the first row it removed."""
    return integer(step, "a rewind's step"), count(row, "a rewind's row")


def writer_lock_row(
    pid: Any, host: Any, heartbeat: Any
) -> tuple[int | None, str | None, float | None]:
    """The writer lock: the writer's process id, host and last heartbeat (all NULL when no
    writer holds it)."""
    if pid is not None:
        count(pid, "the writer's process id")
    return (
        pid,
        optional_text(host, "the writer's host"),
        number(heartbeat, "the writer's heartbeat"),
    )


def status_codes_known(codes: np.ndarray, what: str) -> np.ndarray:
    """Stored status codes, each one GradScope defines (``STATUS_NAMES``)."""
    if len(codes) and int(codes.max()) >= len(STATUS_NAMES):
        raise StoredValueError(
            f"{what} hold status code {int(codes.max())}; the codes are 0-{len(STATUS_NAMES) - 1}"
        )
    return codes


def no_negative(values: np.ndarray, what: str) -> np.ndarray:
    """Norms and ratios: never below 0 (NaN and +Inf are real values here), except
    ``MISSING``, what a step that did not measure a statistic stores for it."""
    # Two counts, no copy of the values: a full load checks tens of millions of them.
    if np.count_nonzero(values < 0) != np.count_nonzero(values == MISSING):
        negative = values[values < 0]
        wrong = negative[negative != MISSING]
        raise StoredValueError(f"{what} hold a negative value ({float(wrong.min()):g})")
    return values


def event(step: Any, kind: Any, layer: Any, message: Any) -> Event:
    return Event(
        integer(step, "an event's step"),
        text(kind, "an event's kind"),
        optional_text(layer, "an event's layer"),
        text(message, "an event's message"),
    )


_ORIGIN_TEXT = ("phase", "tensor", "kind")
_ORIGIN_OPTIONAL_TEXT = ("module", "op", "file", "code")


def origin(data: Any) -> Origin:
    """An ``origins`` row's JSON: an object with Origin's fields (unknown keys are ignored,
    so a newer writer's additions do not make the file unreadable)."""
    try:
        parsed = json.loads(text(data, "a NaN/Inf origin"))
    except json.JSONDecodeError as error:
        raise StoredValueError(f"a NaN/Inf origin is not valid JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise StoredValueError(f"a NaN/Inf origin is a JSON {type(parsed).__name__}, not an object")
    missing = [key for key in ("step", *_ORIGIN_TEXT) if key not in parsed]
    if missing:
        raise StoredValueError(f"a NaN/Inf origin lacks {', '.join(missing)}")
    step = integer(parsed["step"], "a NaN/Inf origin's step")
    for key in _ORIGIN_TEXT:
        text(parsed[key], f"a NaN/Inf origin's {key}")
    for key in _ORIGIN_OPTIONAL_TEXT:
        optional_text(parsed.get(key), f"a NaN/Inf origin's {key}")
    line = parsed.get("line")
    if line is not None:
        integer(line, "a NaN/Inf origin's line")
    details = parsed.get("details", {})
    if not isinstance(details, dict):
        raise StoredValueError(
            f"a NaN/Inf origin's details are a JSON {type(details).__name__}, not an object"
        )
    return Origin(
        step=step,
        phase=parsed["phase"],
        module=parsed.get("module"),
        tensor=parsed["tensor"],
        kind=parsed["kind"],
        op=parsed.get("op"),
        file=parsed.get("file"),
        line=line,
        code=parsed.get("code"),
        details=details,
    )


def early_warning(data: Any) -> EarlyWarning:
    """A ``warnings`` row's JSON: an object with EarlyWarning's fields (unknown keys are
    ignored, as an origin's are)."""
    try:
        parsed = json.loads(text(data, "an early warning"))
    except json.JSONDecodeError as error:
        raise StoredValueError(f"an early warning is not valid JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise StoredValueError(f"an early warning is a JSON {type(parsed).__name__}, not an object")
    missing = [
        key
        for key in ("step", "module", "kind", "quantity", "value", "limit", "evidence")
        if key not in parsed
    ]
    if missing:
        raise StoredValueError(f"an early warning lacks {', '.join(missing)}")
    steps_left = parsed.get("steps_left")
    return EarlyWarning(
        step=integer(parsed["step"], "an early warning's step"),
        module=optional_text(parsed["module"], "an early warning's module"),
        kind=text(parsed["kind"], "an early warning's kind"),
        quantity=text(parsed["quantity"], "an early warning's quantity"),
        value=_json_number(parsed["value"], "an early warning's value"),
        limit=number(parsed["limit"], "an early warning's limit"),
        evidence=text(parsed["evidence"], "an early warning's evidence"),
        steps_left=None
        if steps_left is None
        else count(steps_left, "an early warning's steps_left"),
        hint=text(parsed.get("hint", ""), "an early warning's hint"),
    )


def _json_number(value: Any, what: str) -> float:
    found = number(value, what)
    if found is None:
        raise StoredValueError(f"{what} is null, not a number")
    return found
