"""The forward tracer: a ``TorchFunctionMode`` that sees every torch operation of the re-run.

Per operation it checks which non-finite kinds the operation made from operands free of
them, and labels each autograd node it creates with the operation, the innermost module
being run and the line of user code that called it (:func:`user_location`); a custom
``torch.autograd.Function`` is one operation. It keeps the evidence a hint reads (operand
dtypes, who made each operand, where a mask came from) and the weights a forward writes in
place, so that they can be put back. Used by :mod:`gradscope.core.origin.traced_step`.
"""

from __future__ import annotations

import inspect
import linecache
import math
import os
import sys
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from gradscope.core import tensor_tree
from gradscope.core.facts import SourceLocation
from gradscope.core.mask_flow import MaskProvenance, aggregated_operands, holds_inf
from gradscope.core.origin.kinds import _flags, _new_kind, tensor_summary
from gradscope.core.tensor_tree import float_tensors

_TORCH_DIR = os.path.dirname(torch.__file__)
_GRADSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The instruments' own frames (this package and the tensor-tree walk it calls) are passed
# over on the way out to the user's line, whatever the frame of GradScope's that follows.
_INSTRUMENT_DIR = os.path.dirname(__file__) + os.sep


def _is_user_file(filename: str) -> bool:
    return (
        not filename.startswith(_INSTRUMENT_DIR)
        and filename != tensor_tree.__file__
        and not filename.startswith((_TORCH_DIR + os.sep, "<"))
    )


def _location_of(frame: Any) -> SourceLocation | None:
    """The first frame from ``frame`` outwards that is the user's; None when it is
    GradScope's own (its default loss): then no line of the user's made the operation."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if _is_user_file(filename):
            if filename.startswith(_GRADSCOPE_DIR + os.sep):
                return None
            line = frame.f_lineno
            return SourceLocation(filename, line, linecache.getline(filename, line).rstrip())
        frame = frame.f_back
    return None


def user_location() -> SourceLocation | None:
    """The line of user code that called the current torch operation: the innermost frame
    outside torch and this module. None when that frame is GradScope's own (its default
    loss): then no line of the user's made the operation."""
    return _location_of(sys._getframe(1))


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", repr(func))
    module = getattr(func, "__module__", None) or ""
    qualname = getattr(func, "__qualname__", name)
    if module.startswith("torch.nn.functional"):
        return f"F.{name}"
    if "Tensor" in qualname or module == "torch._tensor" or module is None:
        return f"Tensor.{name}"
    if module.startswith("torch"):
        return f"torch.{name}"
    return name


@dataclass
class _OpRecord:
    op: str
    module: str | None
    location: SourceLocation | None
    # a custom autograd.Function: the op inside its forward that made the value
    inner: dict[str, Any] | None = None
    function: bool = False


@dataclass
class _Candidate:
    """An op whose output gained a NaN (from NaN-free inputs) or an Inf (from Inf-free
    inputs); or, with ``propagated``, the first op of the loss code whose output was
    non-finite at all (when the loss only carried what came in)."""

    record: _OpRecord
    kind: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    evidence: dict[str, Any] = field(default_factory=dict)
    propagated: bool = False
    from_mask: bool = False  # an Inf made by summing or multiplying a by-design -inf


def _asked_kinds(args: tuple, kwargs: dict[str, Any]) -> frozenset[str]:
    """Kinds an op is given as a Python number (``masked_fill(mask, float("-inf"))``,
    ``torch.full(..., -inf)``): it makes them on purpose; attention masks are built that way."""
    leaves, _ = tree_flatten((args, kwargs))
    kinds = set()
    for value in leaves:
        if isinstance(value, float) and not math.isfinite(value):
            kinds.add("nan" if math.isnan(value) else "inf")
    return frozenset(kinds)


def _is_inplace(name: str, kwargs: dict[str, Any]) -> bool:
    return (
        (name.endswith("_") and not name.startswith("__"))
        or name.startswith("__i")
        or kwargs.get("out") is not None
    )


def _function_classes() -> dict[Any, type]:
    """The user's ``torch.autograd.Function`` subclasses by the code of their ``forward``
    (torch's own, like checkpointing's, stay transparent)."""
    found: dict[Any, type] = {}
    pending = list(torch.autograd.Function.__subclasses__())
    seen: set[type] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        if (getattr(cls, "__module__", "") or "").startswith("torch"):
            continue
        code = getattr(cls.__dict__.get("forward"), "__code__", None)
        if code is None:
            code = getattr(getattr(cls.__dict__.get("forward"), "__func__", None), "__code__", None)
        if code is not None:
            found[code] = cls
    return found


def _is_checkpoint_node(node: Any) -> bool:
    cls = getattr(node, "_forward_cls", None)
    return cls is not None and cls.__name__ == "CheckpointFunction"


def _module_from_frames(frame: Any, modules: dict[int, str]) -> str | None:
    """The module whose ``forward`` is running, for code the hooks did not see (a
    ``module.forward(...)`` called directly)."""
    while frame is not None:
        if frame.f_code.co_name == "forward":
            owner = frame.f_locals.get("self")
            if owner is not None and id(owner) in modules:
                return modules[id(owner)]
        frame = frame.f_back
    return None


class _Tracer(TorchFunctionMode):
    """Sees every torch operation of the diagnostic forward: labels the autograd nodes it
    creates with (op, module, line), keeps the candidate ops that made a NaN or an Inf, and
    tells ``keep_weight`` of a weight before an op writes it in place."""

    def __init__(
        self,
        module_stack: list[str],
        params: dict[int, str],
        modules: dict[int, str],
        weight_storage: dict[int, torch.Tensor],
        module_objects: dict[str, nn.Module],
    ) -> None:
        super().__init__()
        self.module_stack = module_stack
        self.params = params
        self.modules = modules
        self.module_objects = module_objects
        self.weight_storage = weight_storage
        # told of each weight an op is about to write in place, so that it can be put back
        self.keep_weight: Callable[[torch.Tensor], None] = lambda weight: None
        self.labels: dict[Any, _OpRecord] = {}
        self.candidates: list[_Candidate] = []
        self.loss_fallback: _Candidate | None = None
        self.masks = MaskProvenance()
        # where each tensor's by-design -inf was written (the op given -inf, its module and
        # line), followed as the mask is carried: a NaN made from it names that line
        self.mask_sources: dict[int, tuple[weakref.ref, dict[str, Any]]] = {}
        # the model's buffers by identity: an op's recorded inputs name them, so a hint
        # never quotes a running_var as the largest input
        self.buffers = {
            id(buffer): f"{owner + '.' if owner else ''}{local}"
            for owner, module in module_objects.items()
            for local, buffer in module._buffers.items()
            if buffer is not None
        }
        self.function_codes = _function_classes()
        self.function_records: dict[type, _OpRecord] = {}
        self._function_frame: Any = None
        self._function_record: _OpRecord | None = None
        self.checking = True
        self.active = True
        # set during backward: called with each node a recomputation creates
        self.on_new_node: Callable[[Any, _OpRecord], None] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active:
            return func(*args, **kwargs)
        if self.on_new_node is not None:
            return self._backward_call(func, args, kwargs)
        name = getattr(func, "__name__", "")
        inplace = _is_inplace(name, kwargs)
        if inplace or func is F.embedding:
            self._save_written_weights(func, args, kwargs)
        before = None
        if self.checking and inplace:
            # An in-place op overwrites its input: look at it before the call.
            inputs = self._inputs(args, kwargs)
            before = (_flags(inputs), [self._input_summary(t) for t in inputs[:4]])
        out = func(*args, **kwargs)
        outputs = float_tensors(out)
        if not outputs:
            return out
        function_record = self._inside_function() if self.function_codes and self.checking else None
        record: _OpRecord | None = None
        for tensor in outputs:
            node = tensor.grad_fn
            if node is not None and node not in self.labels:
                record = record or self._record(func)
                self._label(node, record)
        if self.checking:
            self._consider(func, args, kwargs, outputs, before, record, function_record)
        return out

    # -- backward: the forward that reentrant checkpointing recomputes ------------------
    def _backward_call(self, func, args, kwargs):
        out = func(*args, **kwargs)
        if torch.is_grad_enabled():
            record = None
            for tensor in float_tensors(out):
                node = tensor.grad_fn
                if node is not None and node not in self.labels:
                    record = record or self._record(func)
                    for new in self._label(node, record):
                        self.on_new_node(new, self.labels[new])
        return out

    def traced_recomputation(self, run_function: Callable) -> Callable:
        """Wrap a reentrant checkpoint's ``run_function``: while it runs in backward, its
        ops are labelled and hooked like the ones of a plain forward."""

        def run(*args: Any) -> Any:
            with self:
                return run_function(*args)

        run.__wrapped__ = run_function  # type: ignore[attr-defined]
        return run

    # -- weights written in place --------------------------------------------------------
    def _save_written_weights(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        if func is F.embedding:
            # F.embedding(input, weight, padding_idx, max_norm, ...) renormalises the weight
            # rows it looks up in place when max_norm is set
            max_norm = kwargs.get("max_norm", args[3] if len(args) > 3 else None)
            weight = kwargs.get("weight", args[1] if len(args) > 1 else None)
            targets = [weight] if max_norm is not None else []
        else:
            targets = [args[0] if args else None, kwargs.get("out")]
        for target in targets:
            if not isinstance(target, torch.Tensor) or not self.weight_storage:
                continue
            try:
                pointer = target.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):
                continue
            weight = self.weight_storage.get(pointer)
            if weight is not None:
                self.keep_weight(weight)

    # -- forward checks ------------------------------------------------------------------
    def _inputs(self, args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor]:
        return [t for t in float_tensors((args, kwargs)) if id(t) not in self.params]

    def _inside_function(self) -> _OpRecord | None:
        """The record of the user's autograd.Function whose ``forward`` is running, if any:
        its name, the module that applied it and the line of ``.apply(...)``."""
        frame = sys._getframe(2)
        while frame is not None:
            cls = self.function_codes.get(frame.f_code)
            if cls is not None:
                if frame is self._function_frame and self._function_record is not None:
                    return self._function_record
                record = _OpRecord(
                    cls.__name__,
                    self._current_module(frame),
                    _location_of(frame.f_back),
                    function=True,
                )
                self._function_frame, self._function_record = frame, record
                self.function_records[cls] = record
                context = frame.f_locals.get("ctx")
                if context is not None and hasattr(context, "_forward_cls"):
                    self.labels.setdefault(context, record)
                return record
            frame = frame.f_back
        return None

    def _consider(self, func, args, kwargs, outputs, before, record, function_record) -> None:
        if before is not None:
            in_flags, input_stats = before
            inputs = None
        else:
            inputs = self._inputs(args, kwargs)
            in_flags, input_stats = _flags(inputs), None
        out_flags = _flags(outputs)
        if not (out_flags[0] or out_flags[1]):
            return
        asked = _asked_kinds(args, kwargs)
        kind = _new_kind(in_flags, out_flags, asked)
        from_mask = False
        if out_flags[1]:
            # follow a by-design -inf: an op that sums or multiplies it into an Inf made it
            if kind is None:
                from_mask = self._aggregates_mask(func, args, kwargs, asked, in_flags)
                kind = "inf" if from_mask else None
            carried = kind is None and self._carries_mask(args, kwargs, asked)
            self.masks.record(outputs, mask=carried)
            if carried:
                self._keep_mask_source(func, args, kwargs, asked, outputs, record)
        propagated = False
        if kind is None:
            # not new here; kept once as the loss's op if the loss only carried it along
            if self.module_stack or self.loss_fallback is not None or _asked_kinds(args, kwargs):
                return
            kind, propagated = ("nan" if out_flags[0] else "inf"), True
        own = record or self._record(func)
        if function_record is not None:
            own = _OpRecord(
                function_record.op,
                function_record.module,
                function_record.location,
                inner={"op": own.op, **(asdict(own.location) if own.location else {})},
                function=True,
            )
        evidence = self._evidence(func, args, kwargs, own)
        operands = self._inputs(args, kwargs)
        if in_flags[1]:
            source = self._mask_source_of(operands)
            if source is not None:
                evidence["inf_from"] = source
        # the ops that made its inputs and theirs (a difference of two means before a
        # sqrt: a cancellation)
        made_by = [self._made_by(t, (own, record)) for t in operands[:4]]
        if any(made_by):
            evidence["inputs_made_by"] = made_by
        candidate = _Candidate(
            own,
            kind,
            input_stats or [self._input_summary(t) for t in (inputs or [])[:4]],
            [tensor_summary(t) for t in outputs[:4]],
            evidence,
            propagated,
            from_mask,
        )
        if propagated:
            self.loss_fallback = candidate
        else:
            self.candidates.append(candidate)

    def _made_by(self, tensor: torch.Tensor, this: tuple[Any, ...]) -> dict[str, Any] | None:
        """The traced op that made ``tensor`` (``op``) and the ops that made its operands
        (``from``), read from the autograd nodes' labels; None for a leaf or an untraced
        value."""
        record = self.labels.get(tensor.grad_fn) if tensor.grad_fn is not None else None
        if record is None or any(record is other for other in this):
            return None
        before, dtypes = [], []
        for node, output_nr in getattr(tensor.grad_fn, "next_functions", ()):
            found = self.labels.get(node) if node is not None else None
            if found is not None and found is not record:
                before.append(found.op)
                dtypes.append(_output_dtype(node, output_nr))
        made: dict[str, Any] = {"op": record.op, "from": before[:4]}
        if any(dtypes):
            # what each operand was computed in: under CUDA autocast a float32 subtraction
            # can take a bfloat16 E(x^2), whose rounding is then the cause
            made["dtypes"] = dtypes[:4]
        return made

    def _input_summary(self, tensor: torch.Tensor) -> dict[str, Any]:
        summary = tensor_summary(tensor)
        buffer = self.buffers.get(id(tensor))
        if buffer is not None:
            summary = {"name": buffer, "buffer": True, **summary}
        return summary

    def _mask_source_of(self, tensors: list[torch.Tensor]) -> dict[str, Any] | None:
        for tensor in tensors:
            entry = self.mask_sources.get(id(tensor))
            if entry is not None and entry[0]() is tensor:
                return entry[1]
        return None

    def _keep_mask_source(self, func, args, kwargs, asked, outputs, record) -> None:
        """Remember where the -inf these outputs carry was written: this op when it was
        given -inf (``masked_fill(mask, -inf)``), else the mask its inputs carried."""
        if "inf" in asked:
            own = record or self._record(func)
            source: dict[str, Any] | None = {"op": own.op, "module": own.module}
            if own.location is not None:
                source.update(asdict(own.location))
        else:
            source = self._mask_source_of(self._inputs(args, kwargs))
        if source is None:
            return
        for tensor in outputs:
            if holds_inf(tensor):
                self.mask_sources[id(tensor)] = (weakref.ref(tensor), source)

    def _carries_mask(self, args: tuple, kwargs: dict[str, Any], asked: frozenset[str]) -> bool:
        return "inf" in asked or self.masks.all_masks(self._inputs(args, kwargs))

    def _aggregates_mask(
        self, func, args, kwargs, asked: frozenset[str], in_flags: tuple[bool, bool]
    ) -> bool:
        """The op summed or multiplied a by-design -inf (and only such Infs) into an Inf."""
        if "inf" in asked or in_flags[0]:
            return False
        # positions count with the weights in (addmm's first tensor is its bias)
        reduced = aggregated_operands(func, float_tensors((args, kwargs)))
        if not reduced or not any(holds_inf(t) for t in reduced):
            return False
        return self.masks.all_masks(self._inputs(args, kwargs))

    def _evidence(self, func, args, kwargs, record: _OpRecord) -> dict[str, Any]:
        from gradscope.core.diagnosis import evidence_for

        try:
            bound = inspect.signature(func).bind_partial(*args, **kwargs).arguments
        except (TypeError, ValueError):
            bound = {f"arg{i}": value for i, value in enumerate(args)} | dict(kwargs)
        module = self.module_objects.get(record.module) if record.module is not None else None
        try:
            return evidence_for(_op_name(func), dict(bound), module)
        except Exception as error:  # evidence is a nicety; never lose the origin over it
            return {"evidence_error": f"{type(error).__name__}: {error}"}

    def _current_module(self, frame: Any = None) -> str | None:
        if self.module_stack:
            return self.module_stack[-1]
        return _module_from_frames(frame or sys._getframe(2), self.modules)

    def _record(self, func: Any) -> _OpRecord:
        return _OpRecord(_op_name(func), self._current_module(), user_location())

    def _label(self, node: Any, record: _OpRecord) -> list[Any]:
        """Label ``node`` and the nodes behind it that are not labelled yet (composite
        operations create several); returns the nodes labelled now."""
        labelled = []
        pending = [node]
        while pending:
            current = pending.pop()
            if current is None or current in self.labels:
                continue
            if type(current).__name__ == "AccumulateGrad":
                continue
            if _is_checkpoint_node(current):
                # reentrant checkpoint: trace the block's recomputation in backward rather
                # than crediting its gradient to the op that consumed its output
                if hasattr(current, "run_function") and not hasattr(
                    current.run_function, "__wrapped__"
                ):
                    current.run_function = self.traced_recomputation(current.run_function)
                self.labels[current] = None  # type: ignore[assignment]
                continue
            forward_cls = getattr(current, "_forward_cls", None)
            own = record
            if forward_cls is not None and not forward_cls.__module__.startswith("torch"):
                own = self.function_records.get(forward_cls) or _OpRecord(
                    forward_cls.__name__, record.module, None, function=True
                )
            self.labels[current] = own
            labelled.append(current)
            if own is record:
                pending.extend(next_node for next_node, _ in current.next_functions)
        return labelled


def _output_dtype(node: Any, output_nr: int) -> str | None:
    """The dtype of the forward value an autograd node made (its gradient's metadata)."""
    try:
        return str(node._input_metadata[output_nr].dtype).removeprefix("torch.")
    except (AttributeError, IndexError, RuntimeError):
        return None
