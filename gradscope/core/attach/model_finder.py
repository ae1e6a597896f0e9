"""Which modules are the script's models, and what each was called with.

Two sources say which module a stepped parameter belongs to:

- torch's global registration hooks, from the moment attach starts: every parameter's owner
  and every submodule's parent as the script builds its models (a dictionary entry per
  registration, nothing at forward or backward). A model is then the smallest module
  holding all the parameters an optimizer steps, also when it is never called (a script
  that calls ``model.forward(x)`` directly, or ``layer.forward`` as the forward-forward
  algorithm does). A module not built while attach ran (unpickled by ``torch.load``) is
  not in them.
- the outermost modules called in forward (a global forward pre-hook and an always-called
  forward hook keep the depth, per thread, so DataParallel's replica threads are not
  roots). A model found from its parameters is replaced by the outermost called module
  that holds it: its ``DistributedDataParallel`` wrapper, named by the model inside.

The forward hooks run only while models are being looked for. During that time a module
with trainable parameters called in training gets, at its first such call, the capture
the watch repeats a NaN/Inf step from (:mod:`gradscope.core.replay`), so that the step
before the first ``optimizer.step()`` (step 0) is captured like any other: the watch made
at that step takes it over. The captures of modules that turn out not to be models go
one optimizer step after the search ends (:meth:`ModelFinder.drop_captures`).

Nothing is put where the script's objects carry it: the capture and the input keeper sit
in torch's call slot of the module (``_compiled_call_impl``), which ``pickle``,
``torch.save``, ``copy.deepcopy`` and ``state_dict`` leave out, so a copy of a model (an
EMA or teacher) is a plain module whose calls are never taken for the model's batch.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from gradscope.core.replay import DEFAULT_GRADIENT_BYTES, StepReplay, make_replay

# Calls kept per model between two optimizer steps: a GAN's discriminator sees the real and
# the fake batch; gradient accumulation several micro-batches. Beyond this the oldest go.
KEPT_CALLS = 16
# torch's slot for a module's call, which ``model(...)`` calls instead of its own call path
# and which ``nn.Module.__getstate__`` leaves out of every copy.
_CALL_SLOT = "_compiled_call_impl"


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


def _call_kwargs() -> dict:
    """The keyword arguments of the module call a global forward pre-hook runs in (torch
    hands such a hook the positional ones only): its caller's ``kwargs``, or {}."""
    frame = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            break
        if frame.f_code.co_name in ("inner", "_call_impl"):
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else {}
        frame = frame.f_back
    return {}


class _InputKeeper:
    """Takes a chosen model's calls in its call slot, where no capture holds it: a wrapper
    (``DataParallel``, whose replicas the capture cannot repeat; ``torch.compile``'s module,
    whose compiled call passes by the capture of the model inside)."""

    def __init__(self, finder: ModelFinder, model: nn.Module) -> None:
        self.finder = finder
        self.model = model
        self.call_impl = model._call_impl

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.finder._remember(id(self.model), args, kwargs)
        return self.call_impl(*args, **kwargs)

    def remove(self) -> None:
        if self.model.__dict__.get(_CALL_SLOT) is self:
            del self.model.__dict__[_CALL_SLOT]


class ModelFinder:
    def __init__(self) -> None:
        self._local = threading.local()
        self._search_handles: list[Any] = []
        self._registration_handles: list[Any] = []
        # what the script built while attach ran: each parameter's module, each module's parent
        # (by id: a weak dictionary would compare tensors with ==; the reference confirms it)
        self._owner: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[nn.Module]]] = {}
        self._parent: weakref.WeakKeyDictionary[nn.Module, weakref.ref[nn.Module]] = (
            weakref.WeakKeyDictionary()
        )
        # id(module) -> weak reference, for every outermost module seen while searching
        self._outermost: dict[int, weakref.ref[nn.Module]] = {}
        # id(module) -> its capture, made at its first training call while searching
        self._captures: dict[int, StepReplay] = {}
        self._not_trained: dict[int, bool] = {}  # id(module) -> owns no trainable parameter
        self._keepers: dict[int, _InputKeeper] = {}
        self._taken: set[int] = set()  # id(model) of the models whose watch took the capture
        self._calls: dict[int, list[tuple[tuple, dict]]] = {}

    def start(self) -> None:
        """The registration hooks, for the whole run (see the module docstring)."""
        if self._registration_handles:
            return
        module = torch.nn.modules.module
        self._registration_handles = [
            module.register_module_parameter_registration_hook(self._on_parameter),
            module.register_module_module_registration_hook(self._on_submodule),
        ]
        self.start_search()

    def _on_parameter(self, module: nn.Module, name: str, parameter: Any) -> None:
        if not isinstance(parameter, torch.Tensor):
            return
        owners, key = self._owner, id(parameter)

        def forget(reference: weakref.ref) -> None:
            # A script that builds modules in its loop would otherwise grow this for good.
            known = owners.get(key)
            if known is not None and known[0] is reference:
                del owners[key]

        owners[key] = (weakref.ref(parameter, forget), weakref.ref(module))

    def _on_submodule(self, module: nn.Module, name: str, submodule: Any) -> None:
        if isinstance(submodule, nn.Module) and submodule is not module:
            self._parent[submodule] = weakref.ref(module)

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
            # (not with_kwargs: torch leaves that flag behind when the hook is removed, and
            # torch.compile then warns about global hooks for the rest of the run)
            register_post(self._on_forward_end, always_call=True),
        ]

    def stop_search(self, chosen: Iterable[nn.Module] = ()) -> None:
        """The forward hooks go (see :meth:`drop_captures` for the captures)."""
        handles, self._search_handles = self._search_handles, []
        for handle in handles:
            handle.remove()
        kept = {id(m) for m in chosen} | set(self._keepers)
        # The inputs kept of modules that were not chosen (a loss module) go now.
        for key in [k for k in self._calls if k not in kept | set(self._captures)]:
            del self._calls[key]

    def drop_captures(self) -> None:
        """The captures no watch took (a teacher's) go. Not at the end of the search: a
        GAN's generator, called before the discriminator's step ends the search, is
        matched to its optimizer at the step after."""
        for capture in self._captures.values():
            capture.close()
        self._captures.clear()

    def _on_forward_start(self, module: nn.Module, args: tuple) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth:
            return
        key = id(module)
        if key not in self._outermost:
            self._outermost[key] = weakref.ref(module)
        if key in self._taken or key in self._keepers:
            return  # a watched model: its watch's capture or its keeper takes the call
        if key in self._captures:
            return  # the capture takes its calls
        capture = self._capture(module) if self._trained(module) else None
        if capture is None:
            # Kept in case it becomes a model at this step: the step's batch.
            self._remember(key, args, {})
        elif capture.model is module:
            # The capture takes the calls from the next one on; this one is already under
            # way: handed to it by hand, as its own entry would have. (A wrapper's capture
            # sits at the model inside, whose call is still to come.)
            self._local.fed = capture
            capture.start_call(args, _call_kwargs())

    def _on_forward_end(self, module: nn.Module, args: tuple, output: Any) -> None:
        depth = max(0, getattr(self._local, "depth", 1) - 1)
        self._local.depth = depth
        if depth:
            return
        capture = self._fed()
        if capture is not None and capture.model is module:
            self._local.fed = None
            capture.end_call(args, {}, output)  # its start took the call

    def _fed(self) -> StepReplay | None:
        return getattr(self._local, "fed", None)

    def _trained(self, module: nn.Module) -> bool:
        """A training call of a module with trainable parameters: what a model's is."""
        if not (module.training and torch.is_grad_enabled()):
            return False
        key = id(module)
        frozen = self._not_trained.get(key)
        if frozen is None:
            frozen = not any(p.requires_grad for p in module.parameters())
            self._not_trained[key] = frozen
        return not frozen

    def _capture(self, module: nn.Module) -> StepReplay | None:
        capture = make_replay(module, max_gradient_bytes=DEFAULT_GRADIENT_BYTES)
        if capture is not None:
            self._captures[id(module)] = capture
            self._calls.pop(id(module), None)
        return capture

    # -- matching parameters to models ------------------------------------------------
    def owners(self, parameters: Iterable[torch.Tensor]) -> tuple[list[nn.Module], int]:
        """The models holding ``parameters`` (one that lies inside another is left out),
        and how many of ``parameters`` none of them holds: the smallest built module
        holding each built group, or the outermost called module holding it; parameters
        not built while attach ran, by the outermost called modules owning them."""
        parameters = list(parameters)
        called = self._called()
        found: list[nn.Module] = []
        unbuilt = []
        for home in self._built_homes(parameters, unbuilt):
            holder = next((c for c in called if _inside(home, c)), home)
            found.append(holder)
        wanted = {id(p) for p in unbuilt}
        for module in called:
            if wanted and any(id(p) in wanted for p in module.parameters()):
                found.append(module)
        chosen: list[nn.Module] = []
        for module in found:
            if any(module is c for c in chosen):
                continue
            if any(other is not module and _inside(module, other) for other in found):
                continue
            chosen.append(module)
        held = {id(p) for m in chosen for p in m.parameters()}
        return chosen, sum(id(p) not in held for p in parameters)

    def _called(self) -> list[nn.Module]:
        alive = []
        for key, reference in list(self._outermost.items()):
            module = reference()
            if module is None:
                del self._outermost[key]
            else:
                alive.append(module)
        return alive

    def _ancestry(self, module: nn.Module) -> list[nn.Module]:
        chain = [module]
        seen = {id(module)}
        while True:
            reference = self._parent.get(chain[-1])
            parent = reference() if reference is not None else None
            if parent is None or id(parent) in seen:
                return chain
            chain.append(parent)
            seen.add(id(parent))

    def _built_homes(self, parameters: list[torch.Tensor], unbuilt: list) -> list[nn.Module]:
        """For the parameters built while attach ran, grouped by the topmost module holding
        them: the smallest module holding each group, or the largest above it that holds
        no other parameter."""
        groups: dict[int, list[list[nn.Module]]] = {}
        for parameter in parameters:
            known = self._owner.get(id(parameter))
            owner = known[1]() if known is not None and known[0]() is parameter else None
            if owner is None:
                unbuilt.append(parameter)
                continue
            chain = self._ancestry(owner)
            groups.setdefault(id(chain[-1]), []).append(chain)
        wanted = {id(p) for p in parameters}
        homes = []
        for chains in groups.values():
            home = chains[0][-1]  # the top; the deepest module on every chain below it
            for candidate in reversed(chains[0]):
                if all(any(m is candidate for m in chain) for chain in chains):
                    home = candidate
                else:
                    break
            # up through the modules that hold nothing else (a model whose only child
            # holds its layers is the model, not that child)
            for parent in self._ancestry(home)[1:]:
                if any(id(p) not in wanted for p in parent.parameters()):
                    break
                home = parent
            homes.append(home)
        return homes

    def called(self, model: nn.Module) -> bool:
        """Whether ``model`` itself was seen called (not only through ``.forward()``)."""
        return id(model) in self._outermost

    # -- the chosen models' inputs ----------------------------------------------------
    def take_capture(self, model: nn.Module) -> StepReplay | None:
        """The capture made at ``model``'s first training call (the watch owns it now)."""
        self._taken.add(id(model))
        return self._captures.pop(id(model), None)

    def keep_inputs(self, model: nn.Module) -> None:
        """Take ``model``'s inputs in its call slot, unless something (the capture) holds it."""
        key = id(model)
        if key in self._keepers or model.__dict__.get(_CALL_SLOT) is not None:
            return
        keeper = _InputKeeper(self, model)
        model.__dict__[_CALL_SLOT] = keeper
        self._keepers[key] = keeper

    def _remember(self, key: int, args: tuple, kwargs: dict) -> None:
        if not torch.is_grad_enabled():
            return  # an evaluation call: no gradient of the next step comes from it
        calls = self._calls.setdefault(key, [])
        calls.append(_detached(args, kwargs))
        if len(calls) > KEPT_CALLS:
            del calls[0]

    def take_calls(self, model: nn.Module, capture: Any = None) -> list[tuple[tuple, dict]]:
        """The (args, kwargs) of ``model``'s calls since the last take, oldest first:
        those ``capture`` (the watch's) kept for this step, else those kept here."""
        kept = self._calls.pop(id(model), [])
        if capture is not None and capture.calls:
            return [(call.args, call.kwargs) for call in capture.kept_calls()]
        return kept

    def close(self) -> None:
        self.stop_search()
        for handle in self._registration_handles:
            handle.remove()
        self._registration_handles = []
        for keeper in self._keepers.values():
            keeper.remove()
        self._keepers.clear()
        for capture in self._captures.values():
            capture.close()
        self._captures.clear()
        self._calls.clear()
        self._outermost.clear()


def _inside(module: nn.Module, container: nn.Module) -> bool:
    return module is container or any(sub is module for sub in container.modules())


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
