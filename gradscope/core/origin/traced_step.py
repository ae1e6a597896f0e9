"""The traced step: one re-run of a failing step's forward and backward with the instruments.

:func:`locate_first_nonfinite` hooks every module (which kinds its inputs carried and its
output carries), runs the forward under the tracer (:mod:`.forward_tracer`), then the
backward with hooks on the labelled autograd nodes, and takes the first module, operation or
node that made a NaN/Inf; the batch is checked by :mod:`.input_blame`. Everything hooked is
removed afterwards and the model's state is put back (:mod:`gradscope.core.invisible_rerun`).
:func:`origin_from_statistics` is what the statistics alone say.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from gradscope.core.facts import Origin, SourceLocation, StepStats
from gradscope.core.invisible_rerun import InvisibleRerun
from gradscope.core.origin.forward_tracer import _Candidate, _OpRecord, _Tracer
from gradscope.core.origin.input_blame import (
    _bad_tensors,
    _BadTensor,
    _blame_input,
    _named_batch,
    _named_call,
)
from gradscope.core.origin.kinds import _all_finite, _flags, _kind, _new_kind, tensor_summary
from gradscope.core.tensor_tree import float_tensors, loss_from_output


@dataclass
class _ModuleCheck:
    first_module: tuple[str | None, str] | None = None  # (module name, kind)
    window: int = 0  # index of the first candidate made during that module's call
    stack: list[tuple[tuple[bool, bool], int]] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    root_inputs: list[_BadTensor] | None = None  # what the root module was called with
    backward: bool = False


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

    # the random generators and Python state are the caller's (locate_safely's)
    rerun = InvisibleRerun(model, run_state=False)
    tracer.keep_weight = rerun.keep_weight
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
        rerun.restore()


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
