"""What the early warnings observe of a watched step, as ``Observation``s:

- the loss and the total gradient norm (whole-model quantities): spikes and drifts;
- each layer's output max |x|: all three detectors, against its output dtype's limits;
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
from gradscope.core.warnings.monitor import EXPONENT, Observation


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
) -> list[Observation]:
    found: list[Observation] = []
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
    if out_max is not None:
        for layer, value in zip(layers, out_max.tolist(), strict=False):
            module = modules.get(layer.name)
            dtype = None if module is None else outputs.dtypes.get(id(module))
            kind = layer.type_name
            found.append(Observation(layer.name, "output max |x|", value, dtype, module_type=kind))
    partitions = stats.figures.get(log_partition.name)
    if partitions is not None:
        head = log_partition.settle()
        for layer, value in zip(layers, partitions.tolist(), strict=False):
            module = modules.get(layer.name)
            if module is not None and id(module) == head:
                dtype = log_partition.dtypes.get(head)
                found.append(
                    Observation(layer.name, "log-partition", value, dtype, EXPONENT, towards)
                )
    if stats.max_abs is not None and stats.loss_scale is None:
        for layer, value in zip(layers, stats.max_abs.tolist(), strict=False):
            dtype = _parameter_dtype(modules, layer)
            found.append(Observation(layer.name, "max |g|", value, dtype, detectors=("headroom",)))
    return found


def _parameter_dtype(modules: Mapping[str, nn.Module], layer: LayerInfo) -> torch.dtype | None:
    module = modules.get(layer.name)
    if module is None:
        return None
    for parameter in module.parameters(recurse=False):
        return parameter.dtype
    return None
