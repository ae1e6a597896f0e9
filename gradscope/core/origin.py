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
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_TORCH_DIR = os.path.dirname(torch.__file__)
_GRADSCOPE_CORE_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_DIRS = (_TORCH_DIR + os.sep, _GRADSCOPE_CORE_DIR + os.sep)


@dataclass
class SourceLocation:
    file: str
    line: int
    code: str


@dataclass
class Origin:
    """The first non-finite value of a step.

    ``phase``: "forward", "loss" or "backward". ``module``: dotted module path ("" is the
    root), None when the value was made outside the model (loss code). ``tensor``: "output",
    "input grad", "<param>.grad" (relative to the module) or "loss". ``kind``: "nan" or "inf".
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


def user_location(skip: tuple[str, ...] = _SKIP_DIRS) -> SourceLocation | None:
    """The innermost stack frame outside torch and GradScope's engine: the user's line."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(skip) and not filename.startswith("<"):
            line = frame.f_lineno
            return SourceLocation(filename, line, linecache.getline(filename, line).rstrip())
        frame = frame.f_back
    return None


def _float_tensors(tree: Any) -> list[torch.Tensor]:
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


class _Tracer(TorchFunctionMode):
    """Labels autograd nodes with (op, module, line) and finds the first forward op whose
    floating outputs are non-finite while its floating inputs were finite."""

    def __init__(self, module_stack: list[str], params: dict[int, str]) -> None:
        super().__init__()
        self.module_stack = module_stack
        self.params = params
        self.labels: dict[Any, _OpRecord] = {}
        self.first_forward_op: tuple[_OpRecord, str] | None = None
        self.active = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        checking = (
            self.first_forward_op is None
            and not name.startswith("__")
            and name
            not in (
                "size",
                "dim",
                "numel",
                "is_floating_point",
                "shape",
                "dtype",
                "device",
                "grad_fn",
            )
        )
        inputs_finite = True
        if checking:
            inputs = [t for t in _float_tensors((args, kwargs)) if id(t) not in self.params]
            inputs_finite = _all_finite(inputs)
        out = func(*args, **kwargs)
        outputs = _float_tensors(out)
        if not outputs:
            return out
        record: _OpRecord | None = None
        for tensor in outputs:
            node = tensor.grad_fn
            if node is not None and node not in self.labels:
                record = record or self._record(func)
                self._label(node, record)
        if checking and inputs_finite and not _all_finite(outputs):
            self.first_forward_op = (record or self._record(func), _kind(outputs))
        return out

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


def _iter_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    yield from model.named_modules()


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

    module_stack: list[str] = []
    check = _ModuleCheck()
    handles = []

    def pre_hook(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            module_stack.append(name)
            if check.first_module is None:
                check.stack.append(_all_finite(_float_tensors((args, kwargs))))
            else:
                check.stack.append(False)

        return hook

    def post_hook(name: str):
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if module_stack:
                module_stack.pop()
            inputs_finite = check.stack.pop() if check.stack else False
            if check.first_module is None and inputs_finite:
                outputs = _float_tensors(output)
                if not _all_finite(outputs):
                    check.first_module = (name, _kind(outputs))

        return hook

    for name, module in _iter_modules(model):
        handles.append(module.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
        handles.append(module.register_forward_hook(post_hook(name), with_kwargs=True))

    saved_grads = {id(p): p.grad for p in model.parameters()}
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    for p in model.parameters():
        p.grad = None
    tracer = _Tracer(module_stack, params)
    backward_hit: list[tuple[_OpRecord, str, str]] = []
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
            _attach_op(origin, tracer.first_forward_op, module)
            return origin
        if not loss_finite:
            origin = Origin(step, "loss", None, "loss", _kind([loss.detach()]))
            _attach_op(origin, tracer.first_forward_op, None)
            return origin
        if loss.requires_grad:
            loss.backward()
        if backward_hit:
            record, tensor, kind = backward_hit[0]
            origin = Origin(step, "backward", record.module, tensor, kind, op=record.op)
            _attach_location(origin, record.location)
            return origin
        return None
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


def _attach_op(origin: Origin, found: tuple[_OpRecord, str] | None, module: str | None) -> None:
    """Name the operation when the tracer's first non-finite op lies inside the blamed
    module (or, for the loss phase, outside every module)."""
    if found is None:
        return
    record, _kind_found = found
    inside = (
        record.module is None
        if module is None
        else record.module is not None
        and (module == "" or record.module == module or record.module.startswith(module + "."))
    )
    if inside:
        origin.op = record.op
        _attach_location(origin, record.location)


def _node_hook(
    node: Any,
    record: _OpRecord,
    hits: list[tuple[_OpRecord, str, str]],
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
                    (record, _grad_target(node, index, record, module_of_param), _kind([grad]))
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
