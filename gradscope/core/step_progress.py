"""How far a long step has got, module by module, and a way to abandon it (Qt-free).

On a large model a step takes seconds to minutes on a CPU: the app shows "forward 5/18" and
"backward 3/18" meanwhile, and when the window closes the step is abandoned at the next
module boundary instead of being waited for. A step that ends this way leaves the model and
optimizer mid-step; only a caller that discards them (the app quitting) may ask for it.

What it hooks is small and only where it pays: a forward hook on each of about 16 modules
(see :func:`progress_modules`), and in each of those forward calls one gradient hook on the
module's output, which fires when backward reaches the module. Each hook adds one to a counter: no
tensor is read, nothing waits for the device. They are attached only to models that are
large (``LARGE_MODEL_PARAMETERS``) or whose last step was slow (``SLOW_STEP_SECONDS``); a
small fast model is never hooked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

SLOW_STEP_SECONDS = 0.5
LARGE_MODEL_PARAMETERS = 5_000_000
_TARGET_MODULES = 16
_MAX_MODULES = 64


class StepAborted(BaseException):
    """Raised inside a step's forward or backward when :meth:`StepProgress.abort` was asked
    for. A BaseException, like KeyboardInterrupt, so that no ``except Exception`` of the
    engine or of the user's code mistakes it for an error of the model."""


@dataclass(frozen=True)
class ProgressSnapshot:
    step: int
    forward_done: int
    backward_done: int
    modules: int
    seconds: float

    def describe(self) -> str:
        if self.backward_done:
            where = f"backward {min(self.backward_done, self.modules)}/{self.modules}"
        elif self.forward_done >= self.modules:
            where = "backward"
        else:
            where = f"forward {self.forward_done}/{self.modules}"
        return f"step {self.step}: {where} modules, {self.seconds:.0f} s"


def _size(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def progress_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose forward and backward are counted: the model's children, with the
    largest one replaced by its own children while there are fewer than ``_TARGET_MODULES``
    (a transformer's stack of blocks is one child: counted whole, a step would show "1 of
    5" for most of its time, and quitting would wait for the whole stack)."""
    modules = list(model.children()) or [model]
    while len(modules) < _TARGET_MODULES:
        expandable = [i for i, m in enumerate(modules) if any(True for _ in m.children())]
        if not expandable:
            break
        largest = max(expandable, key=lambda i: _size(modules[i]))
        modules[largest: largest + 1] = list(modules[largest].children())
    return modules[:_MAX_MODULES]


def _first_tensor(value: object) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(value, dict):
        for item in value.values():
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


class StepProgress:
    """Counts a step's module boundaries. The step's thread calls :meth:`begin` and
    :meth:`end` around each step; any thread may call :meth:`snapshot` and :meth:`abort`."""

    def __init__(self) -> None:
        self.modules = 0
        self.abort_requested = False
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._model: nn.Module | None = None
        self._step: int | None = None
        self._started = 0.0
        self._forward = 0
        self._backward = 0
        self._seen: set[int] = set()

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach_if_useful(self, model: nn.Module, last_step_seconds: float | None) -> bool:
        """Attach to a large model, or to one whose last step was slow; True when attached."""
        if self._model is not model:
            self.detach()
        if self.attached:
            return True
        large = sum(p.numel() for p in model.parameters()) >= LARGE_MODEL_PARAMETERS
        slow = last_step_seconds is not None and last_step_seconds >= SLOW_STEP_SECONDS
        if large or slow:
            self.attach(model)
        return self.attached

    def attach(self, model: nn.Module) -> None:
        self.detach()
        modules = progress_modules(model)
        self._model = model
        self.modules = len(modules)
        self._handles = [module.register_forward_hook(self._on_forward) for module in modules]

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._model = None
        self.modules = 0

    def begin(self, step: int) -> None:
        self._forward = self._backward = 0
        self._seen = set()
        self._started = time.perf_counter()
        self._step = step

    def end(self) -> None:
        self._step = None

    def abort(self) -> None:
        """Abandon the step going on at its next module boundary (raises StepAborted in it)."""
        self.abort_requested = True

    def snapshot(self) -> ProgressSnapshot | None:
        """Where the step going on stands; None between steps or when not attached."""
        step = self._step
        if step is None or not self.attached:
            return None
        return ProgressSnapshot(
            step, self._forward, self._backward, self.modules, time.perf_counter() - self._started
        )

    # -- hooks (the step's thread) ---------------------------------------------------------
    def _on_forward(self, module: nn.Module, _inputs: object, output: object) -> None:
        if self.abort_requested:
            raise StepAborted("the step was abandoned")
        # A module called twice in one forward (a shared ReLU) counts once.
        key = id(module)
        if key in self._seen:
            return
        self._seen.add(key)
        self._forward += 1
        tensor = _first_tensor(output)
        if tensor is not None and tensor.requires_grad and torch.is_grad_enabled():
            tensor.register_hook(self._on_backward)

    def _on_backward(self, _gradient: torch.Tensor) -> None:
        if self.abort_requested:
            raise StepAborted("the step was abandoned")
        self._backward += 1
