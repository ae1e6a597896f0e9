"""The losses ``backward()`` is called on, taken by wrapping ``torch.autograd.backward``.

``Tensor.backward`` calls ``torch.autograd.backward`` through the module attribute at each
call, so one wrapper sees ``loss.backward()``, ``scaler.scale(loss).backward()`` and direct
calls alike, with no hook on the graph and no cost at the backward itself beyond a Python
call. (Graph hooks would need the loss's ``grad_fn`` before backward runs, which is
exactly what the wrapper is handed.) An optimizer step's loss is the sum of the scalar
losses backward was called on since the previous step: a micro-batch loss divided by the
accumulation count sums to the step's mean, and a GAN's ``errD_real.backward();
errD_fake.backward()`` sums to its ``errD``. Kept detached on its device: no
synchronisation until the watch makes its one transfer.

Under a ``GradScaler`` the tensor backward is called on is ``scaler.scale(loss)``: the
loss it scaled is summed instead (:meth:`LossCapture.note_scaled`), so that the recorded
loss is the script's, not 65,536 times it.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch


class LossCapture:
    """Sums the scalar tensors passed to ``torch.autograd.backward`` between two ``take()``."""

    def __init__(self) -> None:
        self._original: Any = None
        self._lock = threading.Lock()
        self._total: torch.Tensor | None = None
        # the last scaler.scale(loss): (a weak reference to its result, the loss)
        self._scaled: tuple[weakref.ref, torch.Tensor] | None = None
        self.backwards = 0  # backward calls so far: a new one means a new step's gradients

    def install(self) -> None:
        if self._original is not None:
            return
        original = torch.autograd.backward
        self._original = original

        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            self.backwards += 1
            self._add(tensors)
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = backward

    def uninstall(self) -> None:
        if self._original is not None:
            torch.autograd.backward = self._original
            self._original = None

    def note_scaled(self, loss: torch.Tensor, scaled: torch.Tensor) -> None:
        """``scaled`` is ``scaler.scale(loss)``: a backward on it adds ``loss``."""
        with self._lock:
            self._scaled = (weakref.ref(scaled), loss.detach())

    def _add(self, tensors: Any) -> None:
        if isinstance(tensors, torch.Tensor):
            tensors = (tensors,)
        elif not isinstance(tensors, (tuple, list)):
            return
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.numel() == 1:
                if not tensor.is_floating_point():
                    continue
                with self._lock:
                    scaled = self._scaled
                    if scaled is not None and scaled[0]() is tensor:
                        tensor = scaled[1]
                        self._scaled = None
                    value = tensor.detach().reshape(()).float()
                    self._total = value if self._total is None else self._total + value

    def take(self) -> torch.Tensor | None:
        """The sum of the losses since the last call (None: no backward ran)."""
        with self._lock:
            total, self._total = self._total, None
        return total
