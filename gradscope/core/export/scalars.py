"""A step's statistics as named scalars: the tags TensorBoard, W&B and a Trainer's logger get.

``gradscope/grad_norm/<layer>`` and ``gradscope/nonfinite/<layer>`` (0 or 1) at every step a
layer is watched; ``gradscope/max_abs/<layer>``, ``gradscope/weight_norm/<layer>`` and
``gradscope/update_ratio/<layer>`` only where the watch measured them (detail steps);
``gradscope/total_grad_norm`` at every step; ``gradscope/<name>/<layer>`` for each named
statistic (``gradscope.Statistic``) at the steps it was due, except at layers it did not apply
to (no point there, never a made-up value). NaN and Inf are kept as they
are: a dashboard that drops them from its plot still has the ``nonfinite`` tag. The model's
root (a layer named "") is ``(model)``. Text beside them: ``gradscope/first_nonfinite`` (the
first NaN/Inf origin) and ``gradscope/warnings/<layer>/<kind>`` (an early warning, at its
step; a whole-model quantity such as the loss is named instead of a layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gradscope.core.facts import STATUS_NONFINITE
from gradscope.core.history import named_figures

if TYPE_CHECKING:
    from gradscope.core.facts import EarlyWarning, LayerInfo, Origin, StepStats

PREFIX = "gradscope"
LAYER_STATISTICS = ("grad_norm", "max_abs", "weight_norm", "update_ratio")
FIRST_ORIGIN_TAG = f"{PREFIX}/first_nonfinite"
WARNINGS_PREFIX = f"{PREFIX}/warnings"


def layer_label(name: str) -> str:
    return name or "(model)"


def layer_tag(statistic: str, name: str) -> str:
    """``gradscope/<statistic>/<layer>``."""
    return f"{PREFIX}/{statistic}/{layer_label(name)}"


def step_scalars(
    names: Sequence[str],
    total_grad_norm: float,
    statistics: dict[str, np.ndarray | None],
    nonfinite: np.ndarray,
    watched: np.ndarray | None = None,
) -> dict[str, float]:
    """The tags and values of one step.

    ``statistics`` maps each of :data:`LAYER_STATISTICS`, and any named statistic, to one
    value per layer of ``names``, or None when the step did not measure it (a statistic
    absent is not measured either); ``nonfinite``: per layer, whether its status is
    nonfinite; ``watched``: per layer, whether it was watched at this step (None: all), so
    that a layer added later has no made-up values before it."""
    rows = np.arange(len(names)) if watched is None else np.flatnonzero(watched)
    scalars: dict[str, float] = {f"{PREFIX}/total_grad_norm": float(total_grad_norm)}
    for statistic, values in statistics.items():
        if values is None:
            continue
        listed = np.asarray(values, dtype=np.float64).tolist()
        for row in rows.tolist():
            scalars[layer_tag(statistic, names[row])] = listed[row]
    flags = np.asarray(nonfinite, dtype=bool).tolist()
    for row in rows.tolist():
        scalars[layer_tag("nonfinite", names[row])] = 1.0 if flags[row] else 0.0
    return scalars


def stats_scalars(stats: StepStats, layers: list[LayerInfo]) -> dict[str, float]:
    """A watch's step as scalars (the statistics the step did not measure are left out; a
    named statistic is in ``stats.figures`` on the steps it was due, and a layer it did not
    apply to, ``stats.absent``, has no point)."""
    scalars = step_scalars(
        [layer.name for layer in layers],
        stats.total_grad_norm,
        {
            "grad_norm": stats.grad_norm,
            "max_abs": stats.max_abs,
            "weight_norm": stats.weight_norm,
            "update_ratio": stats.update_ratio,
            **named_figures(stats),
        },
        stats.status == STATUS_NONFINITE,
    )
    for name, absent in stats.absent.items():
        for index in np.flatnonzero(absent).tolist():
            scalars.pop(layer_tag(name, layers[index].name), None)
    return scalars


def origin_summary(origin: Origin) -> str:
    """The first NaN/Inf origin as a few lines of text (Markdown, as TensorBoard shows it)."""
    lines = [origin.describe()]
    hint = origin.details.get("hint")
    if hint:
        lines.append(f"hint: {hint}")
    return "\n\n".join(lines)


def warning_tag(warning: EarlyWarning) -> str:
    """``gradscope/warnings/<layer>/<kind>`` (``low_headroom``...): a module warns once per
    kind, so the tag is the warning's own."""
    where = warning.quantity if warning.module is None else layer_label(warning.module)
    return f"{WARNINGS_PREFIX}/{where}/{warning.kind.replace(' ', '_')}"


def warning_summary(warning: EarlyWarning) -> str:
    """An early warning as a few lines of text: what was seen, and what practice does."""
    lines = [warning.describe()]
    if warning.hint:
        lines.append(f"hint: {warning.hint}")
    return "\n\n".join(lines)
