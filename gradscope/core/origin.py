"""Where did the first NaN/Inf come from?

The watch only says that a step went non-finite. To say where, :func:`locate_first_nonfinite`
re-runs that step's forward and backward (same batch, same weights, same random state, before
the optimizer touched anything) with instruments that would be too costly to leave on:

- forward pre/post hooks on every module record whether its inputs were finite when it was
  called and whether its output is; the first module, in the order calls finish, whose output
  is non-finite while its inputs were finite made the value (children finish before parents,
  so this is the deepest module whose own code did it);
- a ``TorchFunctionMode`` sees every torch operation, checks the same thing per operation,
  and labels each autograd node it creates with the operation, the innermost module being
  run and the line of user code that called it;
- hooks on those autograd nodes (not ``register_full_backward_hook``, which breaks on
  in-place ReLU) check, in the order gradients are computed, for the first node whose
  incoming gradient is finite and whose outgoing gradient is not.

Everything is removed afterwards; the model's buffers (BatchNorm statistics), gradients and
the random state are restored, so localisation never changes training.
"""

from __future__ import annotations

import linecache
import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

if TYPE_CHECKING:
    from gradscope.core.watch import StepStats

_TORCH_DIR = os.path.dirname(torch.__file__)
_GRADSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class SourceLocation:
    file: str
    line: int
    code: str


@dataclass
class Origin:
    """The first non-finite value of a step.

    ``phase``: "forward", "loss" or "backward"; "unknown" when the diagnosis re-run could
    not say (``details["reason"]`` says why and what to do); or "update" when the weights
    were already non-finite before the step's forward (an optimizer update wrote them;
    ``step`` is then the step whose update did it and ``tensor`` the parameter's name).
    ``module``: dotted module path ("" is the root), None when the value was made outside
    the model (loss code).
    ``tensor``: "output", "input grad", "<param>.grad" (relative to the module) or "loss".
    ``kind``: "nan" or "inf".
    ``op``, ``file``, ``line`` and ``code`` name the operation and the line of user code that
    made it, when the tracer saw it.
    """

    step: int
    phase: str
    module: str | None
    tensor: str
    kind: str
    op: str | None = None
    file: str | None = None
    line: int | None = None
    code: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.phase == "unknown":
            reason = self.details.get("reason") or "the re-run did not say"
            return f"step {self.step}: {self.kind.upper()}, origin not located: {reason}"
        where = (
            "outside the model (loss code)"
            if self.module is None
            else (f"module {self.module or '(model root)'!r}")
        )
        text = (
            f"step {self.step}: first {self.kind.upper()} in {self.phase}, {where}, {self.tensor}"
        )
        if self.op:
            text += f", op {self.op}"
        if self.file:
            text += f" at {self.file}:{self.line}"
            if self.code:
                text += f"  ({self.code.strip()})"
        return text


def user_location() -> SourceLocation | None:
    """The line of user code that called the current torch operation: the innermost frame
    outside torch and this module. None when that frame is GradScope's own (its default
    loss): then no line of the user's made the operation."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != __file__ and not filename.startswith((_TORCH_DIR + os.sep, "<")):
            if filename.startswith(_GRADSCOPE_DIR + os.sep):
                return None
            line = frame.f_lineno
            return SourceLocation(filename, line, linecache.getline(filename, line).rstrip())
        frame = frame.f_back
    return None


def float_tensors(tree: Any) -> list[torch.Tensor]:
    """The floating-point tensors anywhere in ``tree`` (tuples, lists, dicts, named tuples)."""
    leaves, _ = tree_flatten(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.numel())


def _kind(tensors: list[torch.Tensor]) -> str:
    return "nan" if any(bool(torch.isnan(t).any()) for t in tensors if t.numel()) else "inf"


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


@dataclass
class _Candidate:
    """An op whose output gained a NaN (from NaN-free inputs) or an Inf (from finite inputs)."""

    record: _OpRecord
    kind: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]


def tensor_summary(tensor: torch.Tensor) -> dict[str, Any]:
    """min/max/mean (over finite values), NaN and Inf counts, shape and dtype of a tensor."""
    data = tensor.detach()
    finite = data[torch.isfinite(data)] if data.numel() else data
    summary: dict[str, Any] = {
        "shape": list(data.shape),
        "dtype": str(data.dtype).replace("torch.", ""),
        "nan": int(torch.isnan(data).sum()) if data.numel() else 0,
        "inf": int(torch.isinf(data).sum()) if data.numel() else 0,
    }
    if finite.numel():
        as_float = finite.float()
        summary.update(
            min=float(as_float.min()), max=float(as_float.max()), mean=float(as_float.mean())
        )
    return summary


def _asks_for_nonfinite(args: tuple, kwargs: dict[str, Any]) -> bool:
    """An op given a non-finite Python number (``masked_fill(mask, float("-inf"))``,
    ``torch.full(..., -inf)``) makes Inf on purpose: attention masks are built that way."""
    leaves, _ = tree_flatten((args, kwargs))
    return any(isinstance(v, float) and not math.isfinite(v) for v in leaves)


def _is_inplace(name: str, kwargs: dict[str, Any]) -> bool:
    return (
        (name.endswith("_") and not name.startswith("__"))
        or name.startswith("__i")
        or kwargs.get("out") is not None
    )


class _Tracer(TorchFunctionMode):
    """Sees every torch operation of the diagnostic forward: labels the autograd nodes it
    creates with (op, module, line) and keeps the candidate ops that made a NaN or an Inf."""

    def __init__(self, module_stack: list[str], params: dict[int, str]) -> None:
        super().__init__()
        self.module_stack = module_stack
        self.params = params
        self.labels: dict[Any, _OpRecord] = {}
        self.candidates: list[_Candidate] = []
        self.checking = True
        self.active = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        before = None
        if self.checking and _is_inplace(name, kwargs):
            # An in-place op overwrites its input: look at it before the call.
            before = self._inputs(args, kwargs)
            before = (before, [tensor_summary(t) for t in before])
        out = func(*args, **kwargs)
        outputs = float_tensors(out)
        if not outputs:
            return out
        record: _OpRecord | None = None
        for tensor in outputs:
            node = tensor.grad_fn
            if node is not None and node not in self.labels:
                record = record or self._record(func)
                self._label(node, record)
        if self.checking and not _all_finite(outputs) and not _asks_for_nonfinite(args, kwargs):
            self._consider(func, args, kwargs, outputs, before, record)
        return out

    def _inputs(self, args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor]:
        return [t for t in float_tensors((args, kwargs)) if id(t) not in self.params]

    def _consider(self, func, args, kwargs, outputs, before, record) -> None:
        if before is not None:
            inputs, input_stats = before
            in_nan = any(s["nan"] for s in input_stats)
            in_inf = any(s["inf"] for s in input_stats)
        else:
            inputs = self._inputs(args, kwargs)
            input_stats = None
            in_nan = any(bool(torch.isnan(t).any()) for t in inputs if t.numel())
            in_inf = any(bool(torch.isinf(t).any()) for t in inputs if t.numel())
        out_nan = any(bool(torch.isnan(t).any()) for t in outputs if t.numel())
        if out_nan and not in_nan:
            kind = "nan"
        elif not in_nan and not in_inf:
            kind = "inf"
        else:
            return
        self.candidates.append(
            _Candidate(
                record or self._record(func),
                kind,
                input_stats or [tensor_summary(t) for t in inputs[:4]],
                [tensor_summary(t) for t in outputs[:4]],
            )
        )

    def _record(self, func: Any) -> _OpRecord:
        module = self.module_stack[-1] if self.module_stack else None
        return _OpRecord(_op_name(func), module, user_location())

    def _label(self, node: Any, record: _OpRecord) -> None:
        # Composite operations create several nodes; label the new ones behind the output.
        pending = [node]
        while pending:
            current = pending.pop()
            if current is None or current in self.labels:
                continue
            if type(current).__name__ == "AccumulateGrad":
                continue
            self.labels[current] = record
            pending.extend(next_node for next_node, _ in current.next_functions)


@dataclass
class _ModuleCheck:
    first_module: tuple[str, str] | None = None  # (module name, kind)
    stack: list[bool] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)


def locate_first_nonfinite(
    model: nn.Module,
    compute_loss: Callable[[], torch.Tensor],
    step: int = 0,
) -> Origin | None:
    """Re-run ``compute_loss`` (forward and loss) and its backward with instruments and
    return where the first non-finite value appeared, or None if the re-run stayed finite.

    ``compute_loss`` must rebuild the loss from the same batch; the caller restores the
    random state first if the model draws random numbers (dropout).
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

    module_stack: list[str] = []
    check = _ModuleCheck()
    handles = []

    def pre_hook(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            module_stack.append(name)
            if check.first_module is None:
                check.stack.append(_all_finite(float_tensors((args, kwargs))))
            else:
                check.stack.append(False)

        return hook

    def post_hook(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if module_stack:
                module_stack.pop()
            inputs_finite = check.stack.pop() if check.stack else False
            if check.first_module is None and inputs_finite:
                outputs = float_tensors(output)
                if not _all_finite(outputs):
                    check.first_module = (name, _kind(outputs))
                    check.values = {
                        "inputs": [tensor_summary(t) for t in float_tensors((args, kwargs))[:4]],
                        "outputs": [tensor_summary(t) for t in outputs[:4]],
                    }
                    tracer.checking = False

        return hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
        handles.append(module.register_forward_hook(post_hook(name), with_kwargs=True))

    tracer = _Tracer(module_stack, params)
    saved_grads = {id(p): p.grad for p in model.parameters()}
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    for p in model.parameters():
        p.grad = None
    backward_hit: list[_BackwardHit] = []
    try:
        with tracer:
            loss = compute_loss()
        tracer.active = False
        for node, record in tracer.labels.items():
            handles.append(
                node.register_hook(_node_hook(node, record, backward_hit, module_of_param))
            )
        loss_finite = bool(torch.isfinite(loss.detach()).all())
        if check.first_module is not None:
            module, kind = check.first_module
            origin = Origin(step, "forward", module, "output", kind)
            origin.details["module_values"] = check.values
            _attach_op(origin, tracer.candidates)
        elif not loss_finite:
            origin = Origin(step, "loss", None, "loss", _kind([loss.detach()]))
            _attach_op(origin, tracer.candidates)
        else:
            if loss.requires_grad:
                loss.backward()
            if not backward_hit:
                return None
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
            _attach_location(origin, hit.record.location)
        from gradscope.core.diagnosis import hint_for

        origin.details["hint"] = hint_for(origin)
        return origin
    finally:
        for handle in handles:
            handle.remove()
        module_stack.clear()
        with torch.no_grad():
            for buffer, value in saved_buffers:
                buffer.copy_(value)
        for p in model.parameters():
            p.grad = saved_grads.get(id(p))


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


def _inside(record_module: str | None, module: str | None) -> bool:
    if module is None:
        return record_module is None
    if record_module is None:
        return False
    return module == "" or record_module == module or record_module.startswith(module + ".")


def _attach_op(origin: Origin, candidates: list[_Candidate]) -> None:
    """Name the operation: the first candidate op inside the blamed module (outside every
    module for the loss phase)."""
    chosen = next((c for c in candidates if _inside(c.record.module, origin.module)), None)
    if chosen is None:
        return
    origin.op = chosen.record.op
    # The first non-finite value is the op's: an Inf that a later layer turned into NaN is
    # reported as the Inf it started as.
    origin.kind = chosen.kind
    origin.details["values"] = {"inputs": chosen.inputs, "outputs": chosen.outputs}
    _attach_location(origin, chosen.record.location)


@dataclass
class _BackwardHit:
    record: _OpRecord
    node_name: str
    tensor: str
    kind: str
    incoming: list[dict[str, Any]]
    outgoing: list[dict[str, Any]]


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
            if grad.numel() and not bool(torch.isfinite(grad).all()):
                hits.append(
                    _BackwardHit(
                        record,
                        type(node).__name__,
                        _grad_target(node, index, record, module_of_param),
                        _kind([grad]),
                        [tensor_summary(g) for g in incoming[:4]],
                        [tensor_summary(g) for _, g in outgoing[:4]],
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
