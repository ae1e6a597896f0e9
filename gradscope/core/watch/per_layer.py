"""Each statistic read at a step, per layer: its parameters' figures combined as the
statistic says (max, sum, mean or the L2 norm), a forward statistic's placed as measured
(per layer already). A layer none of whose contributions apply (the statistic gave None for
all of them) is absent: NaN, and marked in the masks returned beside the figures."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscope.core.watch.binding import Binding
from gradscope.core.watch.layers import layer_max, layer_norms_of_squares, layer_sums
from gradscope.core.watch.reads import Figures
from gradscope.core.watch.statistics import Statistic


def per_layer_figures(
    binding: Binding,
    figures: Figures,
    reads: tuple[Statistic, ...],
    output_reads: tuple[Statistic, ...],
    *,
    divisor: Any,
    kept: dict[str, np.ndarray],
    failed: set[str],
    layer_count: int,
    absent: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The statistics of ``reads`` (gradient and weight ones; those a parameter keeps
    between steps are in ``kept``, by name) and of ``output_reads`` (forward ones), per
    layer; a statistic in ``failed`` (it failed at this step) is left out. Figures of
    gradients still scaled by a loss scaler are divided by ``divisor`` to the statistic's
    ``scale_power``. ``absent``: per statistic, the parameters it gave None for at this
    step (a bool mask); they contribute nothing to their layer's figure. Returns the
    figures and, per statistic with any, a bool mask of its absent layers (NaN in the
    figures): a layer whose every read parameter gave None, or that no forward call of
    this step measured (every call gave None, or the module did not run)."""
    per_param = figures.per_param
    n_params = len(figures.param_norm)
    per_layer: dict[str, np.ndarray] = {}
    absent_layers: dict[str, np.ndarray] = {}
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for statistic in reads:
            name = statistic.name
            if name in failed:
                continue
            values = kept.get(name) if statistic.kept else per_param.get(name)
            if values is None:  # no gradient at all this step
                values = np.zeros(n_params)
            if statistic.scale_power and figures.scale is not None:
                values = values / divisor**statistic.scale_power
            combine = statistic.combine
            gave_none = None if absent is None else absent.get(name)
            if gave_none is not None:  # rare: they add nothing to their layer
                values = np.where(gave_none, -np.inf if combine == "max" else 0.0, values)
            if combine == "max":
                per_layer[name] = layer_max(binding, values)
            elif combine == "sum":
                per_layer[name] = layer_sums(binding, values)
            elif combine == "mean":
                counted = np.ones(n_params) if statistic.kept else figures.with_grad().astype(float)
                if gave_none is not None:
                    counted = np.where(gave_none, 0.0, counted)
                parts = layer_sums(binding, counted)
                per_layer[name] = np.where(
                    parts > 0, layer_sums(binding, values) / np.maximum(parts, 1), 0.0
                )
            else:
                per_layer[name] = layer_norms_of_squares(binding, np.square(values))
            if gave_none is not None:
                read = np.ones(n_params, dtype=bool) if statistic.kept else figures.with_grad()
                applies = layer_sums(binding, (read & ~gave_none).astype(float))
                none = (layer_sums(binding, gave_none.astype(float)) > 0) & (applies == 0)
                if none.any():
                    per_layer[name][none] = np.nan
                    absent_layers[name] = none
        if output_reads:
            measured: dict[str, np.ndarray] = {}
            for statistic in output_reads:
                if statistic.name not in failed:
                    per_layer[statistic.name] = np.full(layer_count, np.nan)
                    measured[statistic.name] = np.zeros(layer_count, dtype=bool)
            for slots, values in figures.outputs:
                for (name, index), value in zip(slots, values.tolist(), strict=True):
                    if name in measured and index < layer_count:
                        per_layer[name][index] = value
                        measured[name][index] = True
            for name, seen in measured.items():
                if not seen.all():
                    absent_layers[name] = ~seen
    return per_layer, absent_layers
