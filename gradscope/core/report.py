"""What a finished run says: the strict-JSON report and the readable summary table.

One schema serves ``gradscope run --json`` and (from recordings) ``gradscope report``.
Non-finite numbers are written as the strings "nan", "inf" and "-inf" (strict JSON has no
NaN), and steps in which a layer was not watched as null.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.history import MISSING, STATISTICS, RunHistory
from gradscope.core.origin import Origin

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
    return result


def build_report(source: str, device: str, history: RunHistory) -> dict[str, Any]:
    layers = []
    for name, type_name, params in zip(
        history.layer_names, history.layer_types, history.layer_params, strict=True
    ):
        entry: dict[str, Any] = {
            "name": name,
            "type": type_name,
            "params": params,
            "status": history.worst(name),
        }
        for statistic in STATISTICS:
            entry[statistic] = _series(history.series(statistic, name))
        layers.append(entry)
    return {
        "source": source,
        "device": device,
        "steps_run": int(history.count),
        "loss": [json_number(v) for v in history.losses.tolist()],
        "first_nonfinite": origin_to_json(history.first_nonfinite),
        "run_events": run_events(history),
        "layers": layers,
    }


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


def summary_table(history: RunHistory) -> str:
    """Per-layer summary: last and largest gradient norm, largest |g|, worst status."""
    headers = ("layer", "type", "params", "status", "last grad norm", "max grad norm", "max |g|")
    rows = []
    for name, type_name, params in zip(
        history.layer_names, history.layer_types, history.layer_params, strict=True
    ):
        norms = history.series("grad_norm", name)
        measured = norms[norms != MISSING]
        last = measured[-1] if len(measured) else MISSING
        largest = _nan_aware_max(measured)
        maxima = history.series("max_abs", name)
        rows.append(
            (
                name or "(model)",
                type_name,
                f"{params:,}",
                history.worst(name),
                _format(last),
                _format(largest),
                _format(_nan_aware_max(maxima[maxima != MISSING])),
            )
        )
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    right = {2, 4, 5, 6}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    out = [line(headers), line(tuple("-" * w for w in widths))]
    out += [line(r) for r in rows]
    return "\n".join(out)


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
