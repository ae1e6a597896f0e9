"""The user's model inside its wrappers, and running it locally for a diagnosis re-run.

Real training wraps the model: ``DistributedDataParallel`` and ``DataParallel`` (``.module``),
``torch.compile`` (``._orig_mod``), FSDP. GradScope names layers after the model the user
wrote (no ``module.`` or ``_orig_mod.`` prefix), and its diagnosis re-run must not go through
the wrappers: a DDP forward broadcasts buffers and its backward all-reduces gradients (a
re-run on one rank would hang the others), and a compiled forward would recompile under the
tracer's instruments and print dynamo warnings into the user's log.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch
from torch import nn


def _inner(module: nn.Module) -> nn.Module | None:
    """The model one wrapper holds, or None when ``module`` is no wrapper."""
    compiled = getattr(module, "_orig_mod", None)
    if isinstance(compiled, nn.Module):
        return compiled
    if isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return module.module
    return None


def wrapper_chain(model: nn.Module) -> list[nn.Module]:
    """``model`` and every wrapper inside it, outermost first; the last is the user's model."""
    chain = [model]
    while (inner := _inner(chain[-1])) is not None:
        chain.append(inner)
    return chain


def is_compiled(model: nn.Module, wrapped_model: nn.Module) -> bool:
    """Whether the user's ``model`` runs compiled: a ``torch.compile`` wrapper in the chain
    the watch was given, or ``model.compile()``'s compiled call in torch's call slot (which
    the watch's capture may hold in turn: see gradscope.core.replay). A model compiled after
    the watch was made is not seen here; hooks learn it from ``torch.compiler.is_compiling``."""
    if any(hasattr(module, "_orig_mod") for module in wrapper_chain(wrapped_model)):
        return True
    slot = model.__dict__.get("_compiled_call_impl")
    if slot is None:
        return False
    owner = getattr(slot, "gradscope_replay", None)
    if owner is None:
        return True
    capture = owner()
    return capture is not None and getattr(capture, "_wrapped", None) is not None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's own model inside any DDP / DataParallel / torch.compile wrappers."""
    return wrapper_chain(model)[-1]


# Attributes through which wrappers inside a model hold the module they wrap: FSDP1
# (``FullyShardedDataParallel``), activation checkpointing (``checkpoint_wrapper``) and
# ``torch.compile``. Their names are not the user's: layer names leave them out.
WRAPPED_ATTRIBUTES = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def clean_name(name: str) -> str:
    """A module or parameter name as the user wrote it: ``layers.0._fsdp_wrapped_module.
    _checkpoint_wrapped_module.attn.weight`` is ``layers.0.attn.weight``."""
    if "_" not in name:
        return name
    return ".".join(part for part in name.split(".") if part not in WRAPPED_ATTRIBUTES)


def named_layers(model: nn.Module) -> dict[str, nn.Module]:
    """``model.named_modules()`` under the user's names, in registration order: a wrapper
    inside the model (FSDP1, checkpoint_wrapper, compile) and the module it wraps share a
    name, which goes to the module inside (the one that owns the parameters)."""
    out: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        out[clean_name(name)] = module  # pre-order: the wrapped module comes after its wrapper
    return out


def named_parameters(model: nn.Module) -> dict[int, str]:
    """Each parameter's user name, by ``id``; a tied parameter under its first name."""
    return {id(p): clean_name(n) for n, p in model.named_parameters(remove_duplicate=True)}


def sharded_reason(model: nn.Module) -> str | None:
    """Why a re-run of this model's forward would need collectives (FSDP parameters are
    gathered in forward; SyncBatchNorm all-reduces its statistics), or None."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # a torch built without distributed
        return None
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    for name, module in model.named_modules():
        if isinstance(module, (FSDPModule, FullyShardedDataParallel)):
            return (
                f"the model is sharded with FSDP ({name or 'the root'}): a re-run of its forward "
                "would gather parameters from every rank, so it is not re-run"
            )
        if distributed and isinstance(module, nn.SyncBatchNorm) and module.training:
            return (
                f"{name} is a SyncBatchNorm in training mode: a re-run of its forward would "
                "all-reduce statistics with the other ranks, so it is not re-run"
            )
    return None


@contextlib.contextmanager
def running_locally(model: nn.Module) -> Iterator[nn.Module]:
    """Inside, calling ``model`` (a wrapper or not) runs the user's eager model on this rank
    alone: no DDP buffer broadcast or gradient all-reduce, no compiled graph. A caller's
    ``locate`` closure that calls the wrapper therefore needs no change. Yields the eager
    model."""
    chain = wrapper_chain(model)
    eager = chain[-1]
    saved: list[tuple[nn.Module, str, object, bool]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(_restore, saved)  # also when entering a no_sync() fails half-way
        for wrapper, inner in itertools.pairwise(chain):
            had = "forward" in wrapper.__dict__
            saved.append((wrapper, "forward", wrapper.__dict__.get("forward"), had))
            # An instance attribute shadows the class's forward (DDP's broadcasts and
            # reducer preparation, the compiled frame): the wrapper just calls its inner model.
            wrapper.__dict__["forward"] = inner.__call__
            if isinstance(wrapper, nn.parallel.DistributedDataParallel):
                stack.enter_context(wrapper.no_sync())
        # ``module.compile()`` compiles in place: its call goes through _compiled_call_impl.
        for module in eager.modules():
            compiled = module.__dict__.get("_compiled_call_impl")
            if compiled is not None:
                saved.append((module, "_compiled_call_impl", compiled, True))
                module.__dict__["_compiled_call_impl"] = None
        yield eager


def _restore(saved: list[tuple[nn.Module, str, object, bool]]) -> None:
    for module, attribute, value, had in reversed(saved):
        if had:
            module.__dict__[attribute] = value
        else:
            module.__dict__.pop(attribute, None)
