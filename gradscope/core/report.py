"""What a finished run says: the strict-JSON report and the readable summary table.

One schema serves ``gradscope run --json`` and (from recordings) ``gradscope report``.
Non-finite numbers are written as the strings "nan", "inf" and "-inf" (strict JSON has no
NaN), and steps in which a layer was not watched as null.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.facts import EarlyWarning, Origin
from gradscope.core.history import MISSING, STATISTICS, STATUS_MISSING, RunHistory

ORIGIN_FIELDS = ("step", "phase", "module", "tensor", "kind", "op", "file", "line", "code")


def json_number(value: float) -> float | str | None:
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _series(values: np.ndarray) -> list[float | str | None]:
    return [None if v == MISSING else json_number(v) for v in values.tolist()]


def _measured_series(values: np.ndarray, measured: np.ndarray) -> list[float | str | None]:
    """A named statistic's values: null where it was not measured (not due, or the layer not
    watched), whatever the value elsewhere (it may be negative)."""
    return [
        json_number(v) if seen else None
        for v, seen in zip(values.tolist(), measured.tolist(), strict=True)
    ]


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def origin_to_json(origin: Origin | None) -> dict[str, Any] | None:
    """``first_nonfinite``: where, which op and line, a hint, and the values that led there
    (``values.inputs``/``outputs`` for forward and loss, ``grad_in``/``grad_out`` for
    backward: count of NaN/Inf and min/max/mean of the finite entries)."""
    if origin is None:
        return None
    result: dict[str, Any] = {name: getattr(origin, name) for name in ORIGIN_FIELDS}
    result["hint"] = origin.details.get("hint")
    result["values"] = _json_safe(origin.details.get("values"))
    if "reason" in origin.details:  # phase "unknown": why the re-run could not say
        result["reason"] = origin.details["reason"]
    if "trace" in origin.details:  # the re-run's events, forward and backward, in order
        result["trace"] = _json_safe(origin.details["trace"])
    return result


def build_report(
    source: str,
    device: str | None,
    history: RunHistory,
    *,
    settings: dict[str, Any] | None = None,
    world_size: int | None = None,
    warnings: Sequence[EarlyWarning] | None = None,
) -> dict[str, Any]:
    """The report of ``history``. ``steps`` are the step numbers of the rows (after a
    rewind they need not count from 0), ``total_grad_norm`` the norm over every gradient of
    the step (null where the step was not watched), ``settings`` the run's settings as used,
    ``world_size`` the number of processes the statistics cover (null when unknown), and
    ``error`` what stopped the run (null when it finished; ``gradscope run`` fills it), and
    ``warnings`` the early warnings (step, module, kind, quantity, value, limit, steps_left,
    evidence, hint; null when they were not looked for or not recorded).

    Per layer, ``status`` is the worst status over the run, ``status_first_seen_step`` the
    step at which that worst status was first seen, ``last_status`` the status at the last
    step that measured the layer (all null for a layer no step measured), and
    ``finite_max_grad_norm`` the largest gradient norm before the layer's first NaN/Inf
    (null when there is none), kept beside a ``grad_norm`` series that holds the NaN, and
    ``why_tiny`` why its gradient is tiny where the engine saw it (a zero or tiny scale after
    it in its block; null otherwise). Each named statistic (``gradscope.Statistic``) is a
    series under its name, null on the steps it was not due; ``statistics`` (present when
    there are any) says what the watch said of each (label, combine, every, source)."""
    layers = []
    applied = ~history.skipped[: history.count]
    named = {name: history.figure_measured(name) for name in history.figure_names}
    for name, type_name, params in zip(
        history.layer_names, history.layer_types, history.layer_params, strict=True
    ):
        measured = history.measured(name)
        finite_max = _finite_max_before_nonfinite(history.series("grad_norm", name), applied)
        entry: dict[str, Any] = {
            "name": name,
            "type": type_name,
            "params": params,
            "status": history.worst(name) if measured else None,
            "status_first_seen_step": history.worst_first_seen(name) if measured else None,
            "last_status": history.last_status(name),
            "finite_max_grad_norm": None if finite_max == MISSING else json_number(finite_max),
            # why its gradient is tiny, where the engine saw it (a zero or tiny scale after it)
            "why_tiny": history.tiny_reasons.get(name),
        }
        for statistic in STATISTICS:
            entry[statistic] = _series(history.series(statistic, name))
        column = history.column(name)
        for statistic, measured in named.items():
            entry.setdefault(
                statistic,
                _measured_series(history.series(statistic, name), measured[:, column]),
            )
        layers.append(entry)
    watched = (history.status_matrix() != STATUS_MISSING).any(axis=1).tolist()
    total = history.total_grad_norm[: history.count].tolist()
    return {
        "source": source,
        "device": device,
        "world_size": world_size,
        "settings": _json_safe(settings),
        "steps_run": int(history.count),
        "steps": [int(step) for step in history.steps.tolist()],
        "loss": [json_number(v) for v in history.losses.tolist()],
        "total_grad_norm": [
            json_number(v) if seen else None for v, seen in zip(total, watched, strict=True)
        ],
        "first_nonfinite": origin_to_json(history.first_nonfinite),
        # Every NaN/Inf episode's origin (a run can break, recover and break again).
        "nonfinite_origins": [origin_to_json(origin) for origin in history.origins],
        **mixed_precision_json(history),
        "error": None,
        "run_events": run_events(history),
        **statistics_json(history),
        "warnings": None if warnings is None else [warning.to_json() for warning in warnings],
        "layers": layers,
    }


def statistics_json(history: RunHistory) -> dict[str, Any]:
    """``"statistics"``: the named statistics the layers' entries hold, with what is known
    of each; absent when there are none (a report of an older recording is unchanged)."""
    if not history.figure_names:
        return {}
    return {
        "statistics": [
            dataclasses.asdict(history.statistic_info(name)) for name in history.figure_names
        ]
    }


def mixed_precision_json(history: RunHistory) -> dict[str, Any]:
    """With a loss scaler: ``"loss_scale"`` per step and ``"skipped_steps"`` (the steps whose
    scaled gradients overflowed, which the scaler skipped: expected, not failures)."""
    scales = history.loss_scale[: history.count]
    if not scales.any():
        return {}
    return {
        "loss_scale": scales.tolist(),
        "skipped_steps": history.steps[history.skipped[: history.count]].tolist(),
    }


def mixed_precision_line(history: RunHistory) -> str | None:
    """One line on the loss scaler, for the console summary."""
    scales = history.loss_scale[: history.count]
    if not scales.any():
        return None
    skipped = int(history.skipped[: history.count].sum())
    return (
        f"loss scaler: {skipped} of {history.count} step(s) skipped (their scaled gradients "
        f"overflowed); scale {scales[0]:g} -> {scales[-1]:g}"
    )


def write_json(report: dict[str, Any], path: str | Path) -> None:
    text = json.dumps(report, indent=1, allow_nan=False)
    Path(path).write_text(text + "\n", encoding="utf-8")


def _format(value: float) -> str:
    if value == MISSING:
        return "-"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.3e}"


SUMMARY_HEADERS = (
    "layer",
    "type",
    "params",
    "worst status (at step)",
    "last status",
    "last grad norm",
    "max grad norm",
    "max |g|",
)


def _worst_cell(history: RunHistory, name: str) -> str:
    if not history.measured(name):
        return "-"
    first = history.worst_first_seen(name)
    return history.worst(name) + (f" (at {first})" if first is not None else "")


def summary_table(history: RunHistory) -> str:
    """Per-layer summary: the worst status over the run with the step it was first seen,
    the last measured step's status, last and largest gradient norm, largest |g| ("-" for a
    layer no step measured). The largest leave out the steps a loss scaler skipped (their
    scaled gradients overflowed, as designed, and were never applied); a NaN/Inf step
    counts, and the largest finite norm before it is kept beside it."""
    headers = SUMMARY_HEADERS
    applied = ~history.skipped[: history.count]
    rows = []
    for name, type_name, params in zip(
        history.layer_names, history.layer_types, history.layer_params, strict=True
    ):
        norms = history.series("grad_norm", name)
        measured = norms[norms != MISSING]
        last = measured[-1] if len(measured) else MISSING
        largest = _nan_aware_max(norms[(norms != MISSING) & applied])
        largest_text = _format(largest)
        if not math.isfinite(largest) and largest != MISSING:
            before = _finite_max_before_nonfinite(norms, applied)
            if before != MISSING:
                largest_text += f" ({_format(before)} before)"
        maxima = history.series("max_abs", name)
        rows.append(
            (
                name or "(model)",
                type_name,
                f"{params:,}",
                _worst_cell(history, name),
                history.last_status(name) or "-",
                _format(last),
                largest_text,
                _format(_nan_aware_max(maxima[(maxima != MISSING) & applied])),
            )
        )
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    right = {2, 5, 6, 7}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    out = [line(headers), line(tuple("-" * w for w in widths))]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _finite_max_before_nonfinite(norms: np.ndarray, applied: np.ndarray) -> float:
    """The largest norm of the applied, measured steps before the first non-finite one;
    MISSING when there is none."""
    kept = norms[(norms != MISSING) & applied]
    bad = np.flatnonzero(~np.isfinite(kept))
    before = kept[: bad[0]] if len(bad) else kept
    return float(before.max()) if len(before) else MISSING


def _nan_aware_max(values: np.ndarray) -> float:
    if len(values) == 0:
        return MISSING
    if np.isnan(values).any():
        return float("nan")
    return float(values.max())


def trace_to_json(events: list[Any]) -> list[dict[str, Any]]:
    """``trace``: one entry per event of traced steps, in the order they happened."""
    return [_json_safe(event.to_dict()) for event in events]


# Events of the run itself, not of its gradients: settings changed while it went on, and
# rewinds (with what the abandoned branch found). A report that left them out would state
# the start settings and the kept branch only.
RUN_EVENT_KINDS = ("settings", "rewind")


def run_events(history: RunHistory) -> list[dict[str, Any]]:
    return [
        {"step": event.step, "kind": event.kind, "message": event.message}
        for event in history.events
        if event.kind in RUN_EVENT_KINDS
    ]
