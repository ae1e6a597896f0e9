"""Which modules are the script's models, and what each was called with.

A model is an outermost module: one called while no other module's forward runs (a global
forward pre-hook and an always-called forward hook keep the depth, per thread, so
DataParallel's replica threads are not roots). These global hooks run only while models are
being looked for: once every optimizer that stepped is matched to the models owning its
parameters, they are removed, and only the chosen models keep a forward pre-hook of their
own, which keeps the inputs of each call (detached references, not copies) for the step's
``batch=``. A loss module called on its own (``nn.CrossEntropyLoss()``) is outermost too; it
owns no stepped parameter, so it is never chosen.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

# Calls kept per model between two optimizer steps: a GAN's discriminator sees the real and
# the fake batch; gradient accumulation several micro-batches. Beyond this the oldest go.
KEPT_CALLS = 16


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _detached(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """References to the call's tensors without their graph (no copy). Plain tensor
    arguments, the usual call, skip the pytree walk (a twentieth of its cost)."""
    if all(type(a) is torch.Tensor for a in args):
        plain = tuple(a.detach() for a in args)
    else:
        plain = tree_map(_detach, args)
    return plain, (tree_map(_detach, kwargs) if kwargs else {})


class ModelFinder:
    def __init__(self) -> None:
        self._local = threading.local()
        self._search_handles: list[Any] = []
        # id(module) -> weak reference, for every outermost module seen while searching
        self._outermost: dict[int, weakref.ref[nn.Module]] = {}
        self._watched: dict[int, Any] = {}  # id(model) -> its input pre-hook's handle
        self._calls: dict[int, list[tuple[tuple, dict]]] = {}

    # -- searching ------------------------------------------------------------------
    @property
    def searching(self) -> bool:
        return bool(self._search_handles)

    def start_search(self) -> None:
        if self._search_handles:
            return
        self._local = threading.local()
        register_pre = torch.nn.modules.module.register_module_forward_pre_hook
        register_post = torch.nn.modules.module.register_module_forward_hook
        self._search_handles = [
            register_pre(self._on_forward_start),
            register_post(self._on_forward_end, always_call=True),
        ]

    def stop_search(self) -> None:
        handles, self._search_handles = self._search_handles, []
        for handle in handles:
            handle.remove()
        # The inputs kept of modules that were not chosen (a loss module) go now.
        for key in [k for k in self._calls if k not in self._watched]:
            del self._calls[key]

    def _on_forward_start(self, module: nn.Module, args: tuple) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            key = id(module)
            if key not in self._outermost:
                self._outermost[key] = weakref.ref(module)
            if key not in self._watched:
                # Not yet a chosen model: keep its inputs in case it becomes one at this
                # step (its own pre-hook, with keyword arguments, takes over then).
                self._remember(key, args, {})

    def _on_forward_end(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._local.depth = max(0, getattr(self._local, "depth", 1) - 1)

    # -- matching parameters to models ------------------------------------------------
    def owners(self, parameters: Iterable[torch.Tensor]) -> tuple[list[nn.Module], int]:
        """The outermost modules seen so far that own any of ``parameters`` (one that lies
        inside another is left out), and how many of ``parameters`` none of them owns."""
        wanted = {id(p) for p in parameters}
        candidates = []
        for key, reference in list(self._outermost.items()):
            module = reference()
            if module is None:
                del self._outermost[key]
                continue
            owned = {id(p) for p in module.parameters()} & wanted
            if owned:
                candidates.append((module, owned))
        inner = set()
        for module, _ in candidates:
            for other, _ in candidates:
                if other is not module and any(sub is other for sub in module.modules()):
                    inner.add(id(other))
        chosen = [(m, owned) for m, owned in candidates if id(m) not in inner]
        covered: set[int] = set().union(*(owned for _, owned in chosen)) if chosen else set()
        return [m for m, _ in chosen], len(wanted - covered)

    # -- the chosen models' inputs ----------------------------------------------------
    def watch_inputs(self, model: nn.Module) -> None:
        key = id(model)
        if key in self._watched:
            return

        def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self._remember(key, args, kwargs)

        self._watched[key] = model.register_forward_pre_hook(keep, with_kwargs=True)

    def _remember(self, key: int, args: tuple, kwargs: dict) -> None:
        if not torch.is_grad_enabled():
            return  # an evaluation call: no gradient of the next step comes from it
        calls = self._calls.setdefault(key, [])
        calls.append(_detached(args, kwargs))
        if len(calls) > KEPT_CALLS:
            del calls[0]

    def take_calls(self, model: nn.Module) -> list[tuple[tuple, dict]]:
        """The (args, kwargs) of ``model``'s calls since the last take, oldest first."""
        return self._calls.pop(id(model), [])

    def close(self) -> None:
        self.stop_search()
        for handle in self._watched.values():
            handle.remove()
        self._watched.clear()
        self._calls.clear()
        self._outermost.clear()


def calls_as_batch(calls: list[tuple[tuple, dict]]) -> Any:
    """Calls' inputs as one batch for the watch: a call with a single positional argument
    as that argument, else its arguments (and keywords) as a dict (``arg0``, ...); several
    calls as ``{"call0": ..., "call1": ...}``. None when there was no call."""
    batches = []
    for args, kwargs in calls:
        if len(args) == 1 and not kwargs:
            batches.append(args[0])
            continue
        batch: dict[str, Any] = {f"arg{index}": value for index, value in enumerate(args)}
        batch.update(kwargs)
        batches.append(batch)
    if not batches:
        return None
    if len(batches) == 1:
        return batches[0]
    return {f"call{index}": batch for index, batch in enumerate(batches)}
