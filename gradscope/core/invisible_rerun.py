"""The re-run is invisible: what a diagnosis re-run changes is put back, here and nowhere else.

Locating a NaN/Inf runs the user's forward and backward once more (the user's ``locate``,
the watch's repeat of a captured step, a callback's repeat of the library's step: all of
them through :func:`gradscope.core.safe_locate.locate_safely`, and
:func:`gradscope.core.origin.locate_first_nonfinite` for its own callers). The run after it
must not be able to tell: the next dropout mask, the next batch-norm statistics, the next
optimizer step are the ones they would have been. :class:`InvisibleRerun` takes a snapshot
before the re-run and puts it back after:

- the model's tensors: every buffer (its values, and the buffer itself where the forward
  replaced it), each parameter's ``.data`` (a forward that swaps it) and ``.grad`` (set
  aside, so the re-run's backward starts from none), and the weights a forward writes in
  place (``nn.Embedding(max_norm=...)``), copied when the tracer sees the write;
- the ``.grad`` of the other leaves the re-run's loss reaches (a GAN's discriminator when
  the generator is watched, an input that requires a gradient), set aside once the loss
  exists, before its backward;
- every random generator (:mod:`gradscope.core.rng`);
- the modules' plain Python attributes (numbers, flags, strings: a call counter in
  ``forward``).

Where a repeat starts is the other half of the same promise: :func:`start_from` puts the
generators and the buffers a captured forward wrote back where that forward found them.

Nothing here synchronises with the device except the copies themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from gradscope.core.rng import RandomState, capture_random_state, restore_random_state
from gradscope.core.tensor_tree import loss_from_output

_PLAIN_TYPES = (int, float, bool, str, type(None))


class InvisibleRerun:
    """A snapshot of what one re-run of ``model`` may change, taken when it is made;
    :meth:`restore` (or leaving the ``with`` block) puts it back.

    ``model_tensors``: the buffers, parameters' data and gradients, and the weights the
    tracer reports through :meth:`keep_weight`. ``run_state``: the random generators, the
    modules' plain Python state, and the gradients of other leaves set aside through
    :meth:`watching`. A traced step takes the first part around its forward and backward
    (it promises that much to a direct caller); :func:`locate_safely` the second around the
    whole re-run, so each is put back exactly where it was taken."""

    def __init__(
        self, model: nn.Module, *, model_tensors: bool = True, run_state: bool = True
    ) -> None:
        self._model = model
        self._own = {id(p) for p in model.parameters()}
        self._model_tensors = model_tensors
        self._weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._other_grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._random: RandomState | None = None
        self._plain: _PlainState | None = None
        self.python_changes = ""
        if model_tensors:
            self._grads = {id(p): p.grad for p in model.parameters()}
            self._data = [(p, p.data) for p in model.parameters()]
            self._buffers = [
                (owner, name, buffer, buffer.detach().clone())
                for owner in model.modules()
                for name, buffer in owner._buffers.items()
                if buffer is not None
            ]
            for p in model.parameters():
                p.grad = None
        if run_state:
            self._random = capture_random_state()
            self._plain = _PlainState(model)

    def __enter__(self) -> InvisibleRerun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def keep_weight(self, weight: torch.Tensor) -> None:
        """``weight`` is about to be written in place by the re-run: its value now is the
        one to put back (the first write's; later ones change nothing)."""
        if id(weight) not in self._weights:
            self._weights[id(weight)] = (weight, weight.detach().clone())

    def watching(self, locate: Callable[[], Any]) -> Callable[[], Any]:
        """``locate``, setting aside the ``.grad`` of every leaf its loss reaches that is
        not one of the model's parameters, before anything runs backward through it
        (backward accumulates into an existing ``.grad`` in place)."""

        def run() -> Any:
            output = locate()
            try:
                loss = loss_from_output(output)
            except TypeError:
                return output  # locate_first_nonfinite says what is wrong with it
            self._set_aside_other_gradients(loss)
            return output

        return run

    def _set_aside_other_gradients(self, loss: torch.Tensor) -> None:
        seen: set[Any] = set()
        pending = [loss.grad_fn]
        while pending:
            node = pending.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            leaf = getattr(node, "variable", None)
            if isinstance(leaf, torch.Tensor):
                if id(leaf) not in self._own:
                    self._other_grads.append((leaf, leaf.grad))
                    leaf.grad = None
                continue
            pending.extend(next_node for next_node, _ in node.next_functions)

    def restore(self) -> str:
        """Put back everything the snapshot holds. Returns (and keeps in
        ``python_changes``) a short account of the Python state the re-run had changed,
        empty when none."""
        if self._model_tensors:
            self._model_tensors = False  # once: a second call must not undo the user's
            with torch.no_grad():
                for owner, name, buffer, value in self._buffers:
                    if owner._buffers.get(name) is not buffer:
                        owner._buffers[name] = buffer
                    buffer.copy_(value)
                for p, data in self._data:
                    if p.data.untyped_storage().data_ptr() != data.untyped_storage().data_ptr():
                        p.data = data
                for weight, value in self._weights.values():
                    weight.copy_(value)
            for p in self._model.parameters():
                p.grad = self._grads.get(id(p))
        for leaf, grad in self._other_grads:
            leaf.grad = grad
        self._other_grads.clear()
        if self._random is not None:
            restore_random_state(self._random)
            self._random = None
        if self._plain is not None:
            self.python_changes = self._plain.restore()
            self._plain = None
        return self.python_changes


def start_from(
    random_state: RandomState, buffers: Iterable[tuple[nn.Module, str, torch.Tensor]]
) -> None:
    """Where a repeat of a captured forward starts: the generators as ``random_state``, and
    each buffer ``(owner, name, value)`` the forward wrote back to its value before that
    forward (a buffer since replaced by one of another shape is left alone)."""
    restore_random_state(random_state)
    with torch.no_grad():
        for owner, name, value in buffers:
            buffer = owner._buffers.get(name)
            if buffer is not None and buffer.shape == value.shape:
                buffer.copy_(value)


class _PlainState:
    """The modules' plain Python attributes (numbers, flags, strings, None) before the
    re-run. A forward that counts its calls (``self.calls += 1``) or keeps a flag would
    otherwise see the re-run as one more call of the user's."""

    def __init__(self, model: nn.Module) -> None:
        self._modules = list(model.named_modules())
        self._values = [
            {k: v for k, v in vars(module).items() if type(v) in _PLAIN_TYPES}
            for _, module in self._modules
        ]

    def restore(self) -> str:
        """Put back what the re-run changed (and drop what it added); a short account of
        the changes, empty when there was none."""
        changes = []
        for (name, module), before in zip(self._modules, self._values, strict=True):
            now = vars(module)
            for key, value in list(now.items()):
                if type(value) not in _PLAIN_TYPES:
                    continue
                if key not in before:
                    del now[key]
                elif value is not before[key] and value != before[key]:
                    now[key] = before[key]
                else:
                    continue
                label = f"{name}.{key}" if name else key
                changes.append(f"{label} {before.get(key)!r} -> {value!r}")
            for key, value in before.items():
                if key not in now:  # deleted by the re-run
                    now[key] = value
        shown = ", ".join(changes[:3])
        return shown + (f" and {len(changes) - 3} more" if len(changes) > 3 else "")
