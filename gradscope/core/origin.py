"""Where did the first NaN/Inf come from?

The watch only says that a step went non-finite. To say where, :func:`locate_first_nonfinite`
re-runs that step's forward and backward (same batch, same weights, same random state, before
the optimizer touched anything) with instruments that would be too costly to leave on:

- the batch itself is checked first: NaN in the data (or an Inf that is not a mask and that
  the re-run shows flowing into the first bad value) is the data's fault, phase ``"input"``;
- forward pre/post hooks on every module record which non-finite kinds its inputs carried
  and its output carries; the first module, in the order calls finish, whose output holds a
  kind its inputs did not (NaN from NaN-free inputs, Inf from Inf-free inputs) made the value
  (children finish before parents, so this is the deepest module whose own code did it).
  Values that are non-finite by design (an additive ``-inf`` mask, ``masked_fill(-inf)``)
  therefore blame nobody until something turns them into a NaN;
- a ``TorchFunctionMode`` sees every torch operation, checks the same thing per operation,
  and labels each autograd node it creates with the operation, the innermost module being
  run and the line of user code that called it. A custom ``torch.autograd.Function`` is one
  operation: its name, the module that applied it, the line of ``.apply(...)``;
- hooks on those autograd nodes (not ``register_full_backward_hook``, which breaks on
  in-place ReLU) check, in the order gradients are computed, for the first node whose
  incoming gradient is finite and whose outgoing gradient is not. The forward that reentrant
  activation checkpointing recomputes during backward is traced the same way, so a
  checkpointed block is blamed exactly as it would be without checkpointing.

All checks look at detached tensors (non-reentrant checkpointing compares what autograd saved
in the forward and in the recomputation; a check recorded by autograd would break it).
Everything is removed afterwards; the model's buffers (BatchNorm statistics), gradients and
any weight the forward wrote in place (``nn.Embedding(max_norm=...)``) are restored, so
localisation never changes training. Nothing is hooked before this function runs.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import linecache
import math
import os
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from gradscope.core.facts import SAMPLES_SHOWN, Origin, SourceLocation, StepStats
from gradscope.core.mask_flow import MaskProvenance, aggregated_operands, holds_inf

_TORCH_DIR = os.path.dirname(torch.__file__)
_GRADSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_user_file(filename: str) -> bool:
    return filename != __file__ and not filename.startswith((_TORCH_DIR + os.sep, "<"))


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


def _tensor_leaves(tree: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in tuples, lists, dicts (``ModelOutput`` included), dataclasses and anything
    registered with torch's pytree."""
    if isinstance(tree, torch.Tensor):
        yield tree
        return
    if depth > 24 or tree is None or isinstance(tree, (str, bytes, int, float, bool)):
        return
    if isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensor_leaves(value, depth + 1)
    elif isinstance(tree, Mapping):
        for value in tree.values():
            yield from _tensor_leaves(value, depth + 1)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for item in dataclasses.fields(tree):
            yield from _tensor_leaves(getattr(tree, item.name, None), depth + 1)
    else:
        leaves, _ = tree_flatten(tree)
        if not (len(leaves) == 1 and leaves[0] is tree):
            for value in leaves:
                yield from _tensor_leaves(value, depth + 1)


def float_tensors(tree: Any) -> list[torch.Tensor]:
    """The floating-point tensors anywhere in ``tree`` (tuples, lists, dicts, named tuples,
    dataclasses, ``ModelOutput``-like objects)."""
    return [t for t in _tensor_leaves(tree) if t.is_floating_point()]


def loss_from_output(value: Any) -> torch.Tensor:
    """The loss in what a step computed: a tensor as it is; from a dict, a dataclass or a
    ``ModelOutput``-like object (a model that computes its loss inside ``forward``), its
    ``loss``. Raises ``TypeError`` with a readable message otherwise."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        loss = value.get("loss")
        where = "the dict's 'loss'"
    else:
        loss = getattr(value, "loss", None)
        where = f"{type(value).__name__}.loss"
    if isinstance(loss, torch.Tensor):
        return loss
    if loss is None and (isinstance(value, Mapping) or hasattr(value, "loss")):
        raise TypeError(
            f"{where} is None: the model computed no loss (did it get the labels/targets?)"
        )
    raise TypeError(
        f"expected a loss tensor, or a dict/dataclass/ModelOutput with a 'loss' tensor; got "
        f"{type(value).__name__}"
    )


def _flags(tensors: list[torch.Tensor]) -> tuple[bool, bool]:
    """(has NaN, has Inf) over ``tensors``, looking at detached values only."""
    nan = inf = False
    for tensor in tensors:
        if not tensor.numel():
            continue
        data = tensor.detach()
        if bool(torch.isfinite(data).all()):
            continue
        nan = nan or bool(torch.isnan(data).any())
        inf = inf or bool(torch.isinf(data).any())
        if nan and inf:
            break
    return nan, inf


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t.detach()).all()) for t in tensors if t.numel())


def _kind(tensors: list[torch.Tensor]) -> str:
    return "nan" if _flags(tensors)[0] else "inf"


def _new_kind(
    inputs: tuple[bool, bool], outputs: tuple[bool, bool], by_design: frozenset[str] = frozenset()
) -> str | None:
    """The non-finite kind an output holds that its inputs did not: NaN from NaN-free inputs,
    or Inf from Inf-free inputs; None when it only carries what came in (an additive -inf
    mask passing through is not an error)."""
    in_nan, in_inf = inputs
    out_nan, out_inf = outputs
    if out_nan and not in_nan and "nan" not in by_design:
        return "nan"
    if out_inf and not in_inf and not in_nan and "inf" not in by_design:
        return "inf"
    return None


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


def tensor_summary(tensor: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype, NaN and Inf counts, min and max (``-inf``/``inf`` when the tensor holds
    them) and the mean of the finite values."""
    data = tensor.detach()
    summary: dict[str, Any] = {
        "shape": list(data.shape),
        "dtype": str(data.dtype).replace("torch.", ""),
        "nan": 0,
        "inf": 0,
    }
    if not data.numel():
        return summary
    if not data.is_floating_point():
        as_float = data.double()
        summary.update(
            min=float(as_float.min()), max=float(as_float.max()), mean=float(as_float.mean())
        )
        return summary
    finite_mask = torch.isfinite(data)
    summary["nan"] = int(torch.isnan(data).sum())
    summary["inf"] = int(torch.isinf(data).sum())
    zeros = int((data == 0).sum())
    if zeros:
        summary["zeros"] = zeros  # a 0/0 or a log of 0 shows here
    finite = data[finite_mask].float()
    if finite.numel():
        low, high = float(finite.min()), float(finite.max())
        summary["mean"] = float(finite.mean())
    else:
        low, high = math.inf, -math.inf
    if summary["inf"]:
        if bool((data == -math.inf).any()):
            low = -math.inf
        if bool((data == math.inf).any()):
            high = math.inf
    if low <= high:
        summary["min"], summary["max"] = low, high
    return summary


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
    saves a weight before an op writes it in place."""

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
        self.saved_weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
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
            if weight is not None and id(weight) not in self.saved_weights:
                self.saved_weights[id(weight)] = (weight, weight.detach().clone())

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


@dataclass
class _ModuleCheck:
    first_module: tuple[str | None, str] | None = None  # (module name, kind)
    window: int = 0  # index of the first candidate made during that module's call
    stack: list[tuple[tuple[bool, bool], int]] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    root_inputs: list[_BadTensor] | None = None  # what the root module was called with
    backward: bool = False


def _output_dtype(node: Any, output_nr: int) -> str | None:
    """The dtype of the forward value an autograd node made (its gradient's metadata)."""
    try:
        return str(node._input_metadata[output_nr].dtype).removeprefix("torch.")
    except (AttributeError, IndexError, RuntimeError):
        return None


# -- the batch ---------------------------------------------------------------------------
@dataclass
class _BadTensor:
    """A batch tensor that holds NaN or Inf."""

    path: str
    tensor: torch.Tensor
    nan: int
    inf: int
    by_design: bool  # only -inf among values <= 0: an additive mask or log-probabilities


def _key(key: Any) -> str:
    return json.dumps(key) if isinstance(key, str) else repr(key)


def _paths(tree: Any, path: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        yield path, tree
        return
    if depth > 24:
        return
    if isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from _paths(value, f"{path}[{index}]", depth + 1)
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _paths(value, f"{path}[{_key(key)}]", depth + 1)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for item in dataclasses.fields(tree):
            yield from _paths(getattr(tree, item.name, None), f"{path}.{item.name}", depth + 1)


def _named_batch(batch: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors of a batch with their paths; a pair is ``(inputs, target)`` by convention."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and not hasattr(batch, "_fields"):
        yield from _paths(batch[0], "inputs")
        yield from _paths(batch[1], "target")
    else:
        yield from _paths(batch, "batch")


def _named_call(args: tuple, kwargs: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's call arguments named as the batch's inputs (``model(x)``: ``inputs``;
    ``model(*inputs)``: ``inputs[i]``; ``model(**inputs)``: ``inputs['name']``)."""
    if len(args) == 1 and not kwargs:
        yield from _paths(args[0], "inputs")
        return
    for index, value in enumerate(args):
        yield from _paths(value, f"inputs[{index}]")
    for key, value in kwargs.items():
        yield from _paths(value, f"inputs[{_key(key)}]")


def _bad_tensors(named: Iterator[tuple[str, torch.Tensor]]) -> list[_BadTensor]:
    bad = []
    for path, tensor in named:
        if not (tensor.is_floating_point() or tensor.is_complex()) or not tensor.numel():
            continue
        data = tensor.detach()
        if bool(torch.isfinite(data).all()):
            continue
        nan = int(torch.isnan(data).sum())
        inf = int(torch.isinf(data).sum())
        by_design = False
        if not nan and not data.is_complex():
            finite = data[torch.isfinite(data)]
            by_design = not bool((data == math.inf).any()) and (
                not finite.numel() or float(finite.max()) <= 0.0
            )
        bad.append(_BadTensor(path, data, nan, inf, by_design))
    return bad


def _input_origin(step: int, bad: list[_BadTensor], kind: str, source: str) -> Origin:
    chosen = [b for b in bad if (b.nan if kind == "nan" else b.inf)]
    first = chosen[0]
    data = first.tensor
    wrong = torch.isnan(data) if kind == "nan" else torch.isinf(data)
    positions = torch.nonzero(wrong)
    samples: list[int] = []
    if data.dim():
        samples = torch.unique(positions[:, 0]).tolist()[:20]
    origin = Origin(step, "input", None, first.path, kind)
    shown = positions[:SAMPLES_SHOWN].tolist()
    # the values of the batch tensors at fault; the first also says where (these reach the
    # JSON report, which writes an origin's values)
    values = [{"path": b.path, **tensor_summary(b.tensor)} for b in chosen[:4]]
    values[0].update(positions=shown, samples=samples)
    origin.details.update(
        source=source,
        count=first.nan if kind == "nan" else first.inf,
        positions=shown,
        samples=samples,
        tensors=[
            {"path": b.path, "nan": b.nan, "inf": b.inf, "mask_like": b.by_design} for b in bad
        ],
        values={"batch": values},
    )
    from gradscope.core.diagnosis import hint_for

    origin.details["hint"] = hint_for(origin)
    return origin


def _blame_input(
    step: int, bad: list[_BadTensor], found: Origin | None, source: str
) -> Origin | None:
    """The batch's fault, or None when the model's own origin stands. NaN in the data is,
    unless the model handled it (``nan_to_num``, ``torch.where``) and then made a NaN/Inf of
    its own in forward or loss from values free of it; an Inf that looks like a mask (only
    -inf, among values <= 0) never is; any other Inf is when the model's first bad value
    only carried what came in: the loss merely propagated it, or a NaN was made from inputs
    that already held Inf."""
    if not bad:
        return None
    if any(b.nan for b in bad):
        if (
            found is not None
            and found.phase in ("forward", "loss")
            and not (
                found.details.get("propagated") or (found.phase == "loss" and found.op is None)
            )
        ):
            return None  # made by the model from NaN-free values
        origin = _input_origin(step, bad, "nan", source)
        if found is not None:
            origin.details["model_origin"] = found.describe()
        return origin
    suspects = [b for b in bad if b.inf and not b.by_design]
    if not suspects or found is None or found.phase not in ("forward", "loss"):
        return None
    if found.kind == "inf" and found.op is not None and not found.details.get("propagated"):
        return None  # an Inf the model made from Inf-free inputs
    carried_inf = found.op is None or found.details.get("propagated")
    for key in ("values", "module_values"):
        stats = (found.details.get(key) or {}).get("inputs") or []
        carried_inf = carried_inf or any(s.get("inf") for s in stats)
    if not carried_inf:
        return None
    origin = _input_origin(step, suspects, "inf", source)
    origin.details["model_origin"] = found.describe()
    return origin


def locate_first_nonfinite(
    model: nn.Module,
    compute_loss: Callable[[], Any],
    step: int = 0,
    *,
    batch: Any = None,
) -> Origin | None:
    """Re-run ``compute_loss`` (forward and loss) and its backward with instruments and
    return where the first non-finite value appeared, or None if the re-run stayed finite.

    ``compute_loss`` must rebuild the loss from the same batch; it may return the loss or an
    output holding it (see :func:`loss_from_output`). The caller restores the random state
    first if the model draws random numbers (dropout). ``batch``: the batch the failing step
    used (any nesting of tuples, lists and dicts of tensors; ``(inputs, target)`` by
    convention): NaN/Inf in it is reported as phase "input". Without it, the arguments the
    model is called with are checked the same way.
    """
    params = {id(p): name for name, p in model.named_parameters()}
    module_of_param: dict[int, tuple[str, str]] = {}
    for module_name, module in model.named_modules():
        for local, p in module.named_parameters(recurse=False):
            module_of_param.setdefault(id(p), (module_name, local))
    broken = _nonfinite_parameters(model, module_of_param)
    if broken is not None:
        broken.step = step
        from gradscope.core.diagnosis import hint_for

        broken.details["hint"] = hint_for(broken)
        return broken

    given = _bad_tensors(_named_batch(batch)) if batch is not None else []
    found = _trace_step(model, compute_loss, step, params, module_of_param)
    origin, root_inputs = found
    source = "batch"
    if batch is None:
        given, source = root_inputs or [], "model call"
    blamed = _blame_input(step, given, origin, source)
    if blamed is not None:
        return blamed
    if origin is not None:
        from gradscope.core.diagnosis import hint_for

        origin.details["hint"] = hint_for(origin)
    return origin


def _trace_step(
    model: nn.Module,
    compute_loss: Callable[[], Any],
    step: int,
    params: dict[int, str],
    module_of_param: dict[int, tuple[str, str]],
) -> tuple[Origin | None, list[_BadTensor] | None]:
    module_stack: list[str] = []
    check = _ModuleCheck()
    handles: list[Any] = []
    named_modules = dict(model.named_modules())
    modules = {id(module): name for name, module in named_modules.items()}
    weight_storage = {}
    for p in model.parameters():
        try:
            weight_storage[p.untyped_storage().data_ptr()] = p
        except (RuntimeError, NotImplementedError):
            pass
    tracer = _Tracer(module_stack, params, modules, weight_storage, named_modules)

    def pre_hook(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            module_stack.append(name)
            if check.backward:
                return
            if name == "" and check.root_inputs is None:
                check.root_inputs = _bad_tensors(_named_call(tuple(args), dict(kwargs)))
            if check.first_module is None:
                flags = _flags(float_tensors((args, kwargs)))
            else:
                flags = (True, True)
            check.stack.append((flags, len(tracer.candidates)))

        return hook

    def post_hook(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if module_stack:
                module_stack.pop()
            if check.backward:
                return
            in_flags, window = check.stack.pop() if check.stack else ((True, True), 0)
            if check.first_module is not None:
                return
            outputs = float_tensors(output)
            out_flags = _flags(outputs)
            if not (out_flags[0] or out_flags[1]):
                # What this call's ops made non-finite stayed inside it (a clamp, nan_to_num,
                # a softmax over an fp16 -inf): it is nobody's origin.
                del tracer.candidates[window:]
                return
            kind = _new_kind(in_flags, out_flags)
            if kind is None and out_flags[1]:
                # its Inf inputs were a mask, which one of its ops aggregated into an Inf
                made = any(c.from_mask for c in tracer.candidates[window:])
                kind = "inf" if made else None
            if kind is None:
                return
            if kind == "inf" and len(tracer.candidates) == window:
                # No op of this call made an Inf from Inf-free inputs: it came from a buffer
                # or a constant made on purpose (a causal -inf mask registered at init).
                return
            tracer.checking = False
            if kind == "nan" and in_flags[1] and window:
                # It turned an Inf into NaN, but the model had made that Inf earlier (the
                # code around this module, whose own call has not finished): blame that.
                first = tracer.candidates[0]
                check.first_module = (first.record.module, first.kind)
                check.window = 0
                return
            check.first_module = (name, kind)
            check.window = window
            check.values = {
                "inputs": [tensor_summary(t) for t in float_tensors((args, kwargs))[:4]],
                "outputs": [tensor_summary(t) for t in outputs[:4]],
            }

        return hook

    for name, module in named_modules.items():
        handles.append(module.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
        handles.append(module.register_forward_hook(post_hook(name), with_kwargs=True))

    saved_grads = {id(p): p.grad for p in model.parameters()}
    saved_data = [(p, p.data) for p in model.parameters()]
    saved_buffers = [
        (owner, name, buffer, buffer.detach().clone())
        for owner in model.modules()
        for name, buffer in owner._buffers.items()
        if buffer is not None
    ]
    for p in model.parameters():
        p.grad = None
    backward_hit: list[_BackwardHit] = []
    try:
        with tracer:
            loss = loss_from_output(compute_loss())
        tracer.active = False
        for node, record in tracer.labels.items():
            if record is not None:
                handles.append(
                    node.register_hook(_node_hook(node, record, backward_hit, module_of_param))
                )
        loss_finite = bool(torch.isfinite(loss.detach()).all())
        if check.first_module is not None:
            module, kind = check.first_module
            phase = "forward" if module is not None else "loss"
            origin = Origin(step, phase, module, "output" if module is not None else "loss", kind)
            if check.values:
                origin.details["module_values"] = check.values
            _attach_op(origin, tracer.candidates[check.window :])
        elif not loss_finite:
            origin = _outside_hooks_origin(step, loss, tracer, model_called=check.root_inputs)
        else:
            if loss.requires_grad:
                check.backward = True
                tracer.active = True

                def on_new_node(node: Any, record: _OpRecord) -> None:
                    handles.append(
                        node.register_hook(_node_hook(node, record, backward_hit, module_of_param))
                    )

                tracer.on_new_node = on_new_node
                try:
                    loss.backward()
                finally:
                    tracer.on_new_node = None
                    tracer.active = False
            if not backward_hit:
                return None, check.root_inputs
            hit = backward_hit[0]
            origin = Origin(
                step,
                "backward",
                hit.record.module,
                hit.tensor,
                hit.kind,
                op=f"{hit.record.op} backward ({hit.node_name})",
            )
            origin.details["values"] = {"grad_in": hit.incoming, "grad_out": hit.outgoing}
            if hit.saved:
                origin.details["values"]["saved"] = hit.saved
            if hit.record.function:
                origin.details["custom_function"] = True
            _attach_location(origin, hit.record.location)
        return origin, check.root_inputs
    finally:
        for handle in handles:
            handle.remove()
        module_stack.clear()
        with torch.no_grad():
            for owner, name, buffer, value in saved_buffers:
                if owner._buffers.get(name) is not buffer:
                    owner._buffers[name] = buffer
                buffer.copy_(value)
            for p, data in saved_data:
                if p.data.untyped_storage().data_ptr() != data.untyped_storage().data_ptr():
                    p.data = data
            for weight, value in tracer.saved_weights.values():
                weight.copy_(value)
        for p in model.parameters():
            p.grad = saved_grads.get(id(p))


def _outside_hooks_origin(
    step: int, loss: torch.Tensor, tracer: _Tracer, model_called: Any
) -> Origin:
    """No module's output gained a NaN/Inf but the loss is non-finite: the loss code made it
    (phase "loss"), or model code the hooks did not see (``module.forward(...)`` called
    directly, found from the op's frames: phase "forward")."""
    kind = _kind([loss.detach()])
    outside = [c for c in tracer.candidates if c.record.module is None]
    if model_called is None and not outside and tracer.candidates:
        first = tracer.candidates[0]
        origin = Origin(step, "forward", first.record.module, "output", kind)
        _attach_op(origin, tracer.candidates)
        return origin
    origin = Origin(step, "loss", None, "loss", kind)
    _attach_op(origin, outside)
    if origin.op is None and tracer.loss_fallback is not None:
        _attach_op(origin, [tracer.loss_fallback])
        origin.details["propagated"] = True
    return origin


def _attach_location(origin: Origin, location: SourceLocation | None) -> None:
    if location is not None:
        origin.file, origin.line, origin.code = location.file, location.line, location.code


def _nonfinite_parameters(
    model: nn.Module, module_of_param: dict[int, tuple[str, str]]
) -> Origin | None:
    """Weights that are already NaN/Inf before the step's forward: an earlier optimizer
    update wrote them (phase "update"), so no op of this step is to blame."""
    bad = []
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.numel() and not bool(torch.isfinite(p).all()):
                bad.append(p)
    if not bad:
        return None
    module, local = module_of_param.get(id(bad[0]), ("", "?"))
    names = [".".join(filter(None, module_of_param.get(id(p), ("", "?")))) for p in bad]
    origin = Origin(0, "update", module, local, _kind(bad))
    origin.details["values"] = {"weights": [tensor_summary(p) for p in bad[:4]]}
    origin.details["parameters"] = names
    return origin


def origin_from_statistics(stats: StepStats, details: dict[str, Any] | None = None) -> Origin:
    """What a step's statistics alone say when no re-run pinned the NaN/Inf down: the loss
    phase when the loss is non-finite, otherwise the backward pass, module unknown."""
    nan = (stats.loss is not None and math.isnan(stats.loss)) or bool(np.sum(stats.nan_count))
    kind = "nan" if nan else "inf"
    details = {"reproduced": False, **(details or {})}
    if stats.loss_nonfinite:
        return Origin(stats.step, "loss", None, "loss", kind, details=details)
    return Origin(stats.step, "backward", None, "grad", kind, details=details)


def _inside(record_module: str | None, module: str) -> bool:
    if record_module is None:
        return False
    return module == "" or record_module == module or record_module.startswith(module + ".")


def _attach_op(origin: Origin, candidates: list[_Candidate]) -> None:
    """Name the operation: the first candidate made by the blamed module's own code (then
    by its children) during its call; outside every module for the loss phase. The module,
    the op and the line then always agree."""
    own = [c for c in candidates if c.record.module == origin.module]
    chosen = own[0] if own else None
    if chosen is None and origin.module is not None:
        chosen = next((c for c in candidates if _inside(c.record.module, origin.module)), None)
    if chosen is None:
        return
    origin.op = chosen.record.op
    # The first non-finite value is the op's: an Inf that a later layer turned into NaN is
    # reported as the Inf it started as.
    origin.kind = chosen.kind
    origin.details["values"] = {"inputs": chosen.inputs, "outputs": chosen.outputs}
    if chosen.evidence:
        origin.details["evidence"] = chosen.evidence
    if chosen.record.function:
        origin.details["custom_function"] = True
    if chosen.record.inner:
        origin.details["inside"] = chosen.record.inner
    if chosen.propagated:
        origin.details["propagated"] = True
    if chosen.from_mask:
        origin.details["from_mask"] = True
    _attach_location(origin, chosen.record.location)


@dataclass
class _BackwardHit:
    record: _OpRecord
    node_name: str
    tensor: str
    kind: str
    incoming: list[dict[str, Any]]
    outgoing: list[dict[str, Any]]
    saved: list[dict[str, Any]] = field(default_factory=list)


def _saved_values(node: Any) -> list[dict[str, Any]]:
    """What the node saved from the forward (``self``, ``other``, ``result``...): the values
    its derivative is computed from, with their exact zeros and smallest magnitude. Read in
    the node's hook, before autograd frees them."""
    saved = []
    for attribute in dir(node):
        if not attribute.startswith("_saved_") or attribute.endswith("_raw"):
            continue
        try:
            value = getattr(node, attribute)
        except RuntimeError:  # already freed
            continue
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        data = value.detach()
        summary = {"name": attribute.removeprefix("_saved_"), **tensor_summary(data)}
        if data.numel():
            summary["zeros"] = int((data == 0).sum())
            summary["abs_min"] = float(data.abs().min())
            # below the smallest normal number: its reciprocal overflows (1/1e-39 in float32)
            tiny = torch.finfo(data.dtype).tiny
            subnormal = int(((data != 0) & (data.abs() < tiny)).sum())
            if subnormal:
                summary["subnormal"] = subnormal
        saved.append(summary)
    return saved[:4]


def _node_hook(
    node: Any,
    record: _OpRecord,
    hits: list[_BackwardHit],
    module_of_param: dict[int, tuple[str, str]],
) -> Callable[..., None]:
    def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
        # autograd's naming: grad_outputs arrive at this node, grad_inputs leave it.
        if hits:
            return
        incoming = [g for g in grad_outputs if g is not None]
        outgoing = [(i, g) for i, g in enumerate(grad_inputs) if g is not None]
        if not _all_finite(incoming):
            return
        for index, grad in outgoing:
            if grad.numel() and not bool(torch.isfinite(grad.detach()).all()):
                hits.append(
                    _BackwardHit(
                        record,
                        type(node).__name__,
                        _grad_target(node, index, record, module_of_param),
                        _kind([grad]),
                        [tensor_summary(g) for g in incoming[:4]],
                        [tensor_summary(g) for _, g in outgoing[:4]],
                        _saved_values(node),
                    )
                )
                return

    return hook


def _grad_target(
    node: Any, index: int, record: _OpRecord, module_of_param: dict[int, tuple[str, str]]
) -> str:
    """Name what a node's ``index``-th outgoing gradient is for: a parameter or an input."""
    target = (
        _param_behind(node.next_functions[index][0]) if index < len(node.next_functions) else None
    )
    if target is not None and id(target) in module_of_param:
        owner, local = module_of_param[id(target)]
        if owner == record.module:
            return f"{local}.grad"
        return f"{owner + '.' if owner else ''}{local}.grad"
    return "input grad"


def _param_behind(node: Any, depth: int = 3) -> torch.Tensor | None:
    # A weight reaches its op through AccumulateGrad, sometimes behind a transpose or view.
    while node is not None and depth >= 0:
        variable = getattr(node, "variable", None)
        if variable is not None:
            return variable
        if len(node.next_functions) != 1:
            return None
        node = node.next_functions[0][0]
        depth -= 1
    return None
