"""Trace of one step: every forward call finishing and every gradient arriving in backward,
numbered in the order they happened, so a step can be walked through module by module.

Installed only for a traced step and removed after it (nothing is hooked when trace mode is
off). Forward hooks record each module's output norm and max |x|; tensor hooks registered on
module outputs and inputs (not ``register_full_backward_hook``, which breaks on in-place
ReLU) see the gradient arriving at the output and the gradient leaving to the inputs; hooks
after gradient accumulation record each parameter's gradient. All statistics stay on the
device until the step ends, then cross to the host in one transfer.

Modules that return the same tensor (a container and its last child) share one gradient:
their backward events come in the reverse of their forward order, so for a plain
``nn.Sequential`` the backward events are exactly the forward events reversed. A module's
input gradient is the gradient of that input tensor as a whole (accumulated over every
consumer of the tensor, e.g. a skip connection's two branches).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from gradscope.core.tensor_tree import float_tensors

FORWARD, BACKWARD = "forward", "backward"


@dataclass
class TraceEvent:
    """One event of a traced step. ``out_norm``: norm of the module's output (forward) or of
    the gradient arriving at its output (backward); ``in_norm``: norm of the gradient leaving
    to its inputs (backward; None when no input needs a gradient); ``param_norms``: the
    module's own parameter gradients once accumulated (backward)."""

    step: int
    phase: str
    order: int
    module: str
    out_norm: float = math.nan
    max_abs: float | None = None
    in_norm: float | None = None
    nonfinite: bool = False
    param_norms: dict[str, float] = field(default_factory=dict)
    # with summaries (a diagnosis re-run's trace): what the event produced, the module's
    # output (forward) or the gradients it sent to its inputs and parameters (backward):
    # shape, dtype, nan, inf, min/max/mean of the finite values
    summary: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> dict[str, Any]:
        """The event as a recording and ``gradscope report --json`` keep it: ``phase``,
        ``module``, ``order``, ``nonfinite`` (the NaN + Inf count of what it produced; with
        no summary, 1 when its values were non-finite), the summary's fields and the norms
        the Step trace pane shows (``out_norm``, ``in_norm``, ``max_abs``, ``param_norms``)."""
        summary = dict(self.summary or {})
        count = summary["nan"] + summary["inf"] if summary else int(self.nonfinite)
        return {
            "phase": self.phase,
            "module": self.module,
            "order": self.order,
            "nonfinite": count,
            **summary,
            "out_norm": self.out_norm,
            "in_norm": self.in_norm,
            "max_abs": self.max_abs,
            "param_norms": dict(self.param_norms),
        }


def _norm(tensor: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(tensor.detach(), dtype=torch.float32)


def _summary_values(tensor: torch.Tensor) -> torch.Tensor:
    """[nan, inf, finite min, finite max, finite sum, finite count] of ``tensor``, on its
    device (resolved with the step's one transfer)."""
    data = tensor.detach().float()
    finite = torch.isfinite(data)
    return torch.stack(
        [
            torch.isnan(data).sum().float(),
            torch.isinf(data).sum().float(),
            torch.where(finite, data, math.inf).amin() if data.numel() else data.new_tensor(0),
            torch.where(finite, data, -math.inf).amax() if data.numel() else data.new_tensor(0),
            torch.where(finite, data, 0.0).sum(),
            finite.sum().float(),
        ]
    )


def _merge_summaries(shape: list[int], dtype: str, parts: list[list[float]]) -> dict[str, Any]:
    nan = sum(p[0] for p in parts)
    inf = sum(p[1] for p in parts)
    count = sum(p[5] for p in parts)
    summary: dict[str, Any] = {"shape": shape, "dtype": dtype, "nan": int(nan), "inf": int(inf)}
    if count:
        summary["min"] = min(p[2] for p in parts if p[5])
        summary["max"] = max(p[3] for p in parts if p[5])
        summary["mean"] = sum(p[4] for p in parts) / count
    return summary


class _Pending:
    """Device-side statistics of one event, resolved into floats when the step ends."""

    __slots__ = ("described", "event", "in_parts", "max_abs", "out", "params", "produced")

    def __init__(self, event: TraceEvent) -> None:
        self.event = event
        self.out: torch.Tensor | None = None
        self.max_abs: torch.Tensor | None = None
        self.in_parts: list[torch.Tensor] = []
        self.params: dict[str, torch.Tensor] = {}
        # with summaries: _summary_values of what the event produced, and its first
        # tensor's (shape, dtype)
        self.produced: list[torch.Tensor] = []
        self.described: tuple[list[int], str] | None = None

    def produce(self, tensor: torch.Tensor) -> None:
        if self.described is None:
            self.described = (list(tensor.shape), str(tensor.dtype).replace("torch.", ""))
        self.produced.append(_summary_values(tensor))


class StepTrace:
    """Collects the events of one step; use :func:`trace_step`. ``summaries``: also each
    event's summary (:attr:`TraceEvent.summary`), with GradScope's own statistics hidden
    from any ``TorchFunctionMode`` that is active (a diagnosis re-run's tracer)."""

    def __init__(self, model: nn.Module, step: int, *, summaries: bool = False) -> None:
        self.model = model
        self.step = step
        self.summaries = summaries
        self._pending: list[_Pending] = []
        self._order = 0
        # gradient key (the output's grad_fn, or the tensor for leaves) -> modules whose
        # output it is, in forward order; and -> backward events waiting for an input grad
        self._output_of: dict[Any, list[str]] = {}
        self._input_of: dict[Any, list[str]] = {}
        self._hooked: set[Any] = set()
        self._backward_event: dict[str, _Pending] = {}
        self._param_owner: dict[int, tuple[str, str]] = {}
        self._handles: list[Any] = []
        self._keepalive: list[Any] = []
        self.events: list[TraceEvent] = []

    def _next(self, phase: str, module: str) -> _Pending:
        pending = _Pending(TraceEvent(self.step, phase, self._order, module))
        self._order += 1
        self._pending.append(pending)
        return pending

    # -- forward -----------------------------------------------------------------------
    def install(self) -> None:
        for name, module in self.model.named_modules():
            self._handles.append(module.register_forward_hook(self._forward_hook(name)))
            for local, param in module.named_parameters(recurse=False):
                if param.requires_grad and id(param) not in self._param_owner:
                    self._param_owner[id(param)] = (name, local)
                    self._handles.append(
                        param.register_post_accumulate_grad_hook(self._param_hook(name, local))
                    )

    def _quiet(self) -> Any:
        return torch._C.DisableTorchFunction() if self.summaries else nullcontext()

    def _forward_hook(self, name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            with self._quiet():
                forward(module, args, output)

        def forward(module: nn.Module, args: Any, output: Any) -> None:
            outputs = float_tensors(output)
            pending = self._next(FORWARD, name)
            if outputs:
                norms = torch.stack([_norm(t) for t in outputs])
                pending.out = torch.linalg.vector_norm(norms)
                pending.max_abs = (
                    torch.stack(
                        [t.detach().abs().amax().float() for t in outputs if t.numel()]
                    ).amax()
                    if any(t.numel() for t in outputs)
                    else None
                )
                if self.summaries:
                    pending.produce(outputs[0])
            grad_outputs = [t for t in outputs if t.requires_grad]
            if grad_outputs:
                self._watch(grad_outputs[0], name, self._output_of)
            for tensor in float_tensors(args):
                if tensor.requires_grad:
                    self._watch(tensor, name, self._input_of)

        return hook

    def _watch(self, tensor: torch.Tensor, name: str, table: dict[Any, list[str]]) -> None:
        key = tensor.grad_fn if tensor.grad_fn is not None else tensor
        table.setdefault(key, []).append(name)
        if key in self._hooked:
            return
        self._hooked.add(key)
        self._keepalive.append(key)
        self._handles.append(tensor.register_hook(self._grad_hook(key)))

    # -- backward ----------------------------------------------------------------------
    def _grad_hook(self, key: Any):
        def hook(grad: torch.Tensor) -> None:
            with self._quiet():
                arrived(grad)

        def arrived(grad: torch.Tensor) -> None:
            norm = _norm(grad)
            # the gradient leaving a module to this tensor: its input gradient
            for name in self._input_of.get(key, ()):
                event = self._backward_event.get(name)
                if event is not None:
                    event.in_parts.append(norm)
                    if self.summaries:
                        event.produce(grad)
            # the gradient arriving at the modules whose output this is, outermost first
            for name in reversed(self._output_of.get(key, ())):
                pending = self._next(BACKWARD, name)
                pending.out = norm
                self._backward_event[name] = pending

        return hook

    def _param_hook(self, module: str, local: str):
        def hook(param: torch.Tensor) -> None:
            with self._quiet():
                accumulated(param)

        def accumulated(param: torch.Tensor) -> None:
            event = self._backward_event.get(module)
            if event is None:
                event = self._next(BACKWARD, module)
                self._backward_event[module] = event
            if param.grad is not None:
                event.params[local] = _norm(param.grad)
                if self.summaries:
                    event.produce(param.grad)

        return hook

    # -- end of step -------------------------------------------------------------------
    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._keepalive.clear()

    def resolve(self) -> list[TraceEvent]:
        """Turn the device-side statistics into floats with one transfer."""
        pieces: list[torch.Tensor] = []
        layout: list[tuple[_Pending, str, str | None]] = []
        for pending in self._pending:
            if pending.out is not None:
                pieces.append(pending.out.reshape(1))
                layout.append((pending, "out", None))
            if pending.max_abs is not None:
                pieces.append(pending.max_abs.reshape(1))
                layout.append((pending, "max", None))
            if pending.in_parts:
                pieces.append(torch.linalg.vector_norm(torch.stack(pending.in_parts)).reshape(1))
                layout.append((pending, "in", None))
            for local, value in pending.params.items():
                pieces.append(value.reshape(1))
                layout.append((pending, "param", local))
        summary_start = len(pieces)
        for pending in self._pending:
            pieces.extend(pending.produced)
        with self._quiet():
            flat = torch.cat([p.float().cpu().reshape(-1) for p in pieces]) if pieces else None
        values = flat[:summary_start].tolist() if flat is not None else []
        produced = flat[summary_start:].reshape(-1, 6).tolist() if flat is not None else []
        for pending in self._pending:
            if pending.produced and pending.described is not None:
                parts, produced = (
                    produced[: len(pending.produced)],
                    produced[len(pending.produced) :],
                )
                pending.event.summary = _merge_summaries(*pending.described, parts)
        for (pending, what, local), value in zip(layout, values, strict=True):
            event = pending.event
            if what == "out":
                event.out_norm = value
            elif what == "max":
                event.max_abs = value
            elif what == "in":
                event.in_norm = value
            else:
                event.param_norms[local] = value
        for pending in self._pending:
            event = pending.event
            numbers = [event.out_norm, *(event.param_norms.values())]
            if event.in_norm is not None:
                numbers.append(event.in_norm)
            event.nonfinite = any(not math.isfinite(v) for v in numbers if v is not None)
        self.events = [p.event for p in self._pending]
        self._pending.clear()
        return self.events


@contextmanager
def trace_step(model: nn.Module, step: int = 0, *, summaries: bool = False) -> Iterator[StepTrace]:
    """Trace the forward and backward run inside the ``with`` block; afterwards
    ``trace.events`` holds the ordered events (resolved on exit). ``summaries``: see
    :class:`StepTrace`."""
    trace = StepTrace(model, step, summaries=summaries)
    trace.install()
    try:
        yield trace
    finally:
        trace.remove()
    trace.resolve()


def recorded_trace(origin: Any) -> list[TraceEvent]:
    """The failing step's events as a recording keeps them with its origin
    (``origin.details["trace"]``, see :meth:`TraceEvent.to_json`), back as events the Step
    trace pane walks; [] when the origin has none (a recording made before traces were
    kept, or an origin found from the statistics alone)."""
    details = getattr(origin, "details", None) or {}
    kept = details.get("trace") or []
    events = []
    for entry in kept:
        if not isinstance(entry, dict) or entry.get("phase") not in (FORWARD, BACKWARD):
            continue
        summary = {
            k: entry[k]
            for k in ("shape", "dtype", "nan", "inf", "min", "max", "mean")
            if k in entry
        }
        count = entry.get("nonfinite") or 0
        events.append(
            TraceEvent(
                step=int(origin.step),
                phase=entry["phase"],
                order=int(entry.get("order", len(events))),
                module=str(entry.get("module") or ""),
                out_norm=_as_float(entry.get("out_norm"), math.nan),
                max_abs=_as_float(entry.get("max_abs")),
                in_norm=_as_float(entry.get("in_norm")),
                nonfinite=bool(count),
                param_norms={
                    str(k): _as_float(v, math.nan)
                    for k, v in (entry.get("param_norms") or {}).items()
                },
                summary=summary or None,
            )
        )
    return events


def _as_float(value: Any, missing: Any = None) -> Any:
    """A recorded number (the JSON report writes non-finite ones as "nan", "inf")."""
    if value is None:
        return missing
    try:
        return float(value)
    except (TypeError, ValueError):
        return missing


def first_nonfinite_event(events: list[TraceEvent]) -> int | None:
    """Index of the first event whose values are non-finite."""
    return next((i for i, event in enumerate(events) if event.nonfinite), None)


def gradients_until(events: list[TraceEvent], cursor: int) -> dict[str, float]:
    """Per module, the norm of its own parameters' gradients as they stand once the events up
    to ``cursor`` (inclusive) happened: the gradient-flow chart filling in from the output
    back to the input as a backward pass is walked."""
    squares: dict[str, float] = {}
    seen: dict[str, dict[str, float]] = {}
    for event in events[: cursor + 1]:
        if event.phase != BACKWARD or not event.param_norms:
            continue
        seen.setdefault(event.module, {}).update(event.param_norms)
    for module, norms in seen.items():
        squares[module] = math.sqrt(sum(v * v for v in norms.values()))
    return squares
