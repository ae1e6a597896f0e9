"""What the early warnings observe of a watched step, as ``Observation``s:

- the loss and the total gradient norm (whole-model quantities): spikes and drifts;
- each layer's output max |x|: headroom to its output dtype's limits and drift (not spikes:
  an activation's max doubles from one step to the next on one outlier token in a healthy
  run, as nanoGPT's LayerNorms do; the loss's and gradient norm's spikes are the reported
  precursors);
- the output head's log-partition: headroom and drift, against exp's overflow in the dtype
  an exp of the logits runs in;
- each layer's max |g|: headroom to its parameters' dtype only (a gradient's own growth or
  fall is the exploding and vanishing statuses' business), and not while a loss scaler
  scales the gradients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch
from torch import nn

from gradscope.core.facts import LayerInfo, StepStats
from gradscope.core.warnings.monitor import EXPONENT, LayerObservations, Observation


class OutputFigures(Protocol):
    """A forward statistic's name and the dtype it saw per module (``id``): what
    ``gradscope.core.watch.statistics.output_max_abs`` and ``output_log_partition`` give
    (named by what they offer: the watch imports this package, not the other way)."""

    name: str
    dtypes: dict[int, torch.dtype]


class HeadFigures(OutputFigures, Protocol):
    def settle(self) -> int | None: ...


def step_observations(
    stats: StepStats,
    layers: list[LayerInfo],
    modules: Mapping[str, nn.Module],
    outputs: OutputFigures,
    log_partition: HeadFigures,
) -> list[Observation | LayerObservations]:
    """The step's observations: the whole-model ones and the head's log-partition one by
    one, each per-layer quantity as one ``LayerObservations`` vector."""
    found: list[Observation | LayerObservations] = []
    whole = ("spike", "drift")
    # A log-partition moves by nats as the model grows confident: only its approach to
    # exp's overflow is a warning, not a jump.
    towards = ("headroom", "drift")
    if stats.loss is not None:
        found.append(Observation(None, "loss", float(stats.loss), detectors=whole))
    if stats.total_grad_norm is not None and stats.loss_scale is None:
        norm = float(stats.total_grad_norm)
        found.append(Observation(None, "gradient norm", norm, detectors=whole))
    out_max = stats.figures.get(outputs.name)
    names = tuple(layer.name for layer in layers)
    kinds = tuple(layer.type_name for layer in layers)
    watched = [modules.get(name) for name in names]
    if out_max is not None:
        width = min(len(names), len(out_max))
        dtypes = tuple(
            None if module is None else outputs.dtypes.get(id(module)) for module in watched[:width]
        )
        found.append(
            LayerObservations(
                names[:width],
                "output max |x|",
                out_max[:width],
                dtypes,
                detectors=("headroom", "drift"),
                module_types=kinds,
            )
        )
    partitions = stats.figures.get(log_partition.name)
    if partitions is not None:
        head = log_partition.settle()
        for layer, module, value in zip(layers, watched, partitions.tolist(), strict=False):
            if module is not None and id(module) == head:
                dtype = log_partition.dtypes.get(head)
                found.append(
                    Observation(layer.name, "log-partition", value, dtype, EXPONENT, towards)
                )
    if stats.max_abs is not None and stats.loss_scale is None:
        width = min(len(names), len(stats.max_abs))
        dtypes = tuple(_parameter_dtype(module) for module in watched[:width])
        found.append(
            LayerObservations(
                names[:width], "max |g|", stats.max_abs[:width], dtypes, detectors=("headroom",)
            )
        )
    return found


def _parameter_dtype(module: nn.Module | None) -> torch.dtype | None:
    if module is None:
        return None
    for parameter in module.parameters(recurse=False):
        return parameter.dtype
    return None
