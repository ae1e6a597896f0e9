"""The script's own calls around an optimizer step that attach follows, besides
``optimizer.step()`` itself: a ``GradScaler``'s ``scale`` and ``step``, and gradient
clipping.

- ``scaler.scale(loss)``: which scaler the script uses, and the loss before it was scaled
  (the one recorded, rather than the scaled one ``backward()`` is called on);
- ``scaler.step(optimizer)``: the step is read here, before the scaler decides: a step it
  skips (its scaled gradients overflowed) calls no ``optimizer.step()`` and would otherwise
  be lost, with its step number; a fused optimizer takes the scale inside its kernel, so
  its gradients are still scaled when no ``unscale_`` ran (the watch divides its figures);
- ``clip_grad_norm_`` / ``clip_grad_value_`` (``torch.nn.utils`` and
  ``torch.nn.utils.clip_grad``): the gradients are read before the clipping, as the
  callbacks read them, so that an explosion shows.

Each is replaced by a wrapper on torch's class or module (a script that imports the name
after attach started gets the wrapper too) and put back by :meth:`StepCalls.uninstall`.
The wrappers call back with the objects only; what to do is the session's, whose
callbacks never raise into the script.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

CLIPPERS = ("clip_grad_norm_", "clip_grad_value_")


class StepCalls:
    """``on_scale(scaler, loss, scaled)``, ``on_scaler_step(scaler, optimizer)`` (before the
    scaler decides), ``on_clip(name, parameters, args, kwargs)`` (before clipping); the
    session's optimizer-step hook asks :meth:`inside_scaler_step` whether the step it sees
    was already read at ``scaler.step``."""

    def __init__(
        self,
        on_scale: Callable[[Any, torch.Tensor, torch.Tensor], None],
        on_scaler_step: Callable[[Any, Any], None],
        on_clip: Callable[[str, list[torch.Tensor], tuple, dict], None],
    ) -> None:
        self.on_scale = on_scale
        self.on_scaler_step = on_scaler_step
        self.on_clip = on_clip
        self._saved: list[tuple[Any, str, Any]] = []
        self._local = threading.local()

    def inside_scaler_step(self, optimizer: Any) -> bool:
        return optimizer in getattr(self._local, "stepping", ())

    def install(self) -> None:
        if self._saved:
            return
        scaler_class = torch.amp.GradScaler
        self._replace(scaler_class, "scale", self._scale_wrapper(scaler_class.scale))
        self._replace(scaler_class, "step", self._step_wrapper(scaler_class.step))
        from torch.nn.utils import clip_grad

        for name in CLIPPERS:
            original = getattr(clip_grad, name, None)
            if original is None:
                continue
            wrapper = self._clip_wrapper(name, original)
            self._replace(clip_grad, name, wrapper)
            if getattr(torch.nn.utils, name, None) is original:
                self._replace(torch.nn.utils, name, wrapper)

    def uninstall(self) -> None:
        saved, self._saved = self._saved, []
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)

    def _replace(self, owner: Any, name: str, replacement: Any) -> None:
        self._saved.append((owner, name, vars(owner)[name]))
        setattr(owner, name, replacement)

    def _scale_wrapper(self, original: Any) -> Any:
        calls = self

        @functools.wraps(original)
        def scale(scaler: Any, outputs: Any) -> Any:
            scaled = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
                calls.on_scale(scaler, outputs, scaled)
            return scaled

        return scale

    def _step_wrapper(self, original: Any) -> Any:
        calls = self

        @functools.wraps(original)
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            calls.on_scaler_step(scaler, optimizer)
            stepping = getattr(calls._local, "stepping", None)
            if stepping is None:
                stepping = calls._local.stepping = []
            stepping.append(optimizer)
            try:
                return original(scaler, optimizer, *args, **kwargs)
            finally:
                stepping.remove(optimizer)

        return step

    def _clip_wrapper(self, name: str, original: Any) -> Any:
        calls = self

        @functools.wraps(original)
        def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(parameters, torch.Tensor):
                parameters = [parameters]
            else:
                parameters = list(parameters)  # a generator is read once: keep it
            calls.on_clip(name, parameters, args, kwargs)
            return original(parameters, *args, **kwargs)

        return clip
