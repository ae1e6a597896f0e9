"""Forward statistics (``Statistic.output``): a forward hook on each watched module, present
only on the steps some forward statistic is due and removed as soon as the step is collected,
so that every other step costs nothing. A module called more than once in a step (shared
blocks, gradient accumulation) gets one figure, its calls combined as the statistic's
``combine`` says, on the device as they come (nothing kept per call).

A compiled model runs no Python hook as written: dynamo would trace each hook's bookkeeping
into the user's graph and recompile at every new module it writes down, up to its limit,
then run the user's model eagerly. So forward statistics are not read from a compiled model:
seen when the watch is armed (the watch made on the compiled model, or ``model.compile()``),
or at the first compiled forward (compiled after the watch), where the hooks do nothing and
are not armed again; one warning says so."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gradscope.core.facts import LayerInfo
from gradscope.core.tensor_tree import float_tensors
from gradscope.core.user_warnings import warn_user
from gradscope.core.watch.statistic_set import StatisticSet
from gradscope.core.watch.statistics import Statistic
from gradscope.core.watch.statistics.base import one_value
from gradscope.core.wrappers import is_compiled, named_layers

_set_grad_enabled = torch._C._set_grad_enabled
# Inside a backward (a checkpointed block's forward recomputed there) it is not -1: that
# forward is the step's second run of the block, not a call of its own.
_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)


class _Running:
    """One module's figure of one statistic over the step's calls so far."""

    __slots__ = ("calls", "value")

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value
        self.calls = 1


def _add(combine: str, running: _Running, value: torch.Tensor) -> None:
    if combine == "max":
        running.value = torch.maximum(running.value, value)
    elif combine == "rss":
        running.value = torch.hypot(running.value, value)
    else:  # "sum", and "mean" divided by the calls when taken
        running.value = running.value + value
    running.calls += 1


class OutputReads:
    """The forward statistics of one watch: :meth:`arm` before a step they are due at,
    :meth:`take` when the step is collected."""

    def __init__(self, statistics: StatisticSet) -> None:
        self.statistics = statistics
        self._handles: list[Any] = []
        self._due: tuple[Statistic, ...] = ()
        self._running: dict[tuple[Statistic, int], _Running] = {}
        # A statistic read by its extremes (``extremes(module, output)``: the smallest and
        # largest value, one reduction; ``from_extremes(lows, highs)``: the figures of all
        # modules at once): each module's pair so far.
        self._extremes: dict[tuple[Statistic, int], list[torch.Tensor]] = {}
        self.skipped: str | None = None  # why forward statistics are not read (compiled)
        self._compiled_forward = False  # a hook ran while dynamo traced

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    @property
    def due(self) -> tuple[Statistic, ...]:
        """The statistics the hooks are armed for."""
        return self._due

    def arm(
        self,
        model: nn.Module,
        wrapped_model: nn.Module,
        layers: list[LayerInfo],
        due: tuple[Statistic, ...],
    ) -> None:
        """Hook the watched modules of ``model`` (``wrapped_model``: as the watch was given
        it) for the statistics ``due`` at the next step (none: no hook at all; nor for a
        compiled model)."""
        self.disarm()
        self._running.clear()
        self._extremes.clear()
        self._due = () if self.skipped is not None else due
        if not self._due:
            return
        if is_compiled(model, wrapped_model):
            self._skip()
            return
        modules = named_layers(model)
        for index, layer in enumerate(layers):
            module = modules.get(layer.name)
            if module is not None:
                self._handles.append(module.register_forward_hook(self._hook(index)))

    def _hook(self, index: int) -> Any:
        def measure(module: nn.Module, inputs: Any, output: Any) -> None:
            if torch.compiler.is_compiling():
                self._compiled_forward = True  # dynamo applies it after the graph runs
                return
            # The training forward only: not an evaluation pass under no_grad, not a
            # checkpointed block recomputed in the backward.
            if not torch.is_grad_enabled() or _graph_task() != -1:
                return
            if isinstance(output, torch.Tensor):
                tensor = output if output.is_floating_point() else None
            else:
                found = float_tensors(output)
                tensor = found[0] if found else None
            if tensor is None:
                return
            tensor = tensor.detach()
            _set_grad_enabled(False)
            try:
                for statistic in self._due:
                    if statistic in self.statistics.failures:
                        continue
                    key = (statistic, index)
                    try:
                        extremes = getattr(statistic, "extremes", None)
                        if extremes is not None:
                            low, high = extremes(module, tensor)
                            found = self._extremes.get(key)
                            if found is None:
                                self._extremes[key] = [low, high]
                            else:  # a module called again in the step
                                found[0] = torch.minimum(found[0], low)
                                found[1] = torch.maximum(found[1], high)
                            continue
                        value = statistic.output(module, tensor)
                        if not getattr(statistic, "checked_output", False):
                            value = one_value(statistic, value, tensor)
                    except Exception as error:  # turned off after the step
                        self.statistics.failed(statistic, error)
                        continue
                    if value is None:  # not applicable to this module: no slot
                        continue
                    running = self._running.get(key)
                    if running is None:
                        self._running[key] = _Running(value)
                    else:
                        _add(statistic.combine, running, value)
            finally:
                _set_grad_enabled(True)

        return measure

    def take(self) -> dict[torch.device, tuple[tuple[tuple[str, int], ...], list[torch.Tensor]]]:
        """The step's figures by device: what each is ((statistic name, layer index)) and
        the 0-d tensors; the hooks are removed. A statistic read by its extremes gets one
        stack and one reduction over all its modules here, not one per module."""
        self.disarm()
        if self._compiled_forward:
            self._skip()
        by_device: dict[torch.device, tuple[list, list]] = {}
        for (statistic, index), running in self._running.items():
            value = running.value
            if statistic.combine == "mean" and running.calls > 1:
                value = value / running.calls
            slots, values = by_device.setdefault(value.device, ([], []))
            slots.append((statistic.name, index))
            values.append(value)
        gathered: dict[tuple[Statistic, torch.device], tuple[list, list, list]] = {}
        for (statistic, index), (low, high) in self._extremes.items():
            indices, lows, highs = gathered.setdefault((statistic, low.device), ([], [], []))
            indices.append(index)
            lows.append(low)
            highs.append(high)
        for (statistic, device), (indices, lows, highs) in gathered.items():
            figures = statistic.from_extremes(torch.stack(lows), torch.stack(highs))
            slots, values = by_device.setdefault(device, ([], []))
            slots += [(statistic.name, index) for index in indices]
            values += figures.unbind()  # views: the transfer stacks them in one copy
        self._running.clear()
        self._extremes.clear()
        return {where: (tuple(slots), values) for where, (slots, values) in by_device.items()}

    def _skip(self) -> None:
        names = ", ".join(statistic.name for statistic in self._due)
        self.skipped = "the model is compiled (torch.compile)"
        warn_user(
            f"gradscope: forward statistics ({names}) not read: {self.skipped}; its compiled "
            "forward runs no hook of ours (the gradients' statistics go on)"
        )
        self.disarm()
        self._running.clear()
        self._extremes.clear()
        self._due = ()

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
