"""Repeat a step the watch saw, with nothing from the user.

``collect(loss)`` without ``locate=`` still gets the module, the operation and the line of a
step's first NaN/Inf: :class:`StepReplay` keeps, at every training call of the watched
model (from torch's slot for a module's call, or module hooks: see
:meth:`StepReplay.attach`), what repeating that forward needs:

- the arguments the root was called with, by reference (never copied);
- the state of every random generator (:mod:`gradscope.core.rng`) and the autocast setting;
- the values, before the forward, of the buffers the forward changes (batch-norm running
  statistics; found at the first forward from the buffers' version counters, so a model
  with large constant buffers, a causal mask, copies nothing of them);
- how the backward can be repeated: from the loss the model computes itself (an output
  with ``.loss`` or ``["loss"]``, as transformers models return), or else from the gradient
  that arrives at the model's output, kept by autograd (``retain_grad``) until the next step's
  forward (a user who asked for that gradient too reads it after ``collect()``). The kept
  gradients of a step are bounded by ``max_gradient_bytes``: a larger output is not kept
  (the watch says so once) and its step falls back to the statistics, naming the reason.

None of it synchronises with the device. When a step goes non-finite, :meth:`StepReplay.locate`
repeats each of the step's forward calls (micro-batches: each in turn) through
:func:`gradscope.core.safe_locate.locate_safely`, which bounds it in time, runs no
collective and restores the weights, buffers, gradients and random generators.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from gradscope.core.facts import Origin, StepStats
from gradscope.core.origin import float_tensors
from gradscope.core.rng import (
    NO_RANDOM_STATE,
    RandomState,
    capture_random_state,
    restore_random_state,
)
from gradscope.core.safe_locate import locate_safely, statistics_origin
from gradscope.core.user_warnings import warn_user
from gradscope.core.wrappers import sharded_reason, unwrap_model, wrapper_chain

DEFAULT_GRADIENT_BYTES = 256 * 2**20
# Forward calls of one step kept for the repeat (micro-batches); older ones are dropped,
# also once the inputs they keep alive pass max_gradient_bytes (the latest is always kept).
MAX_CALLS_PER_STEP = 16
# Forwards that show whether the model draws from Python's or numpy's generator.
HOST_DRAW_CHECKS = 3


_any_autocast = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled
_graph_task_id = torch._C._current_graph_task_id
_cuda = torch.cuda  # its ``_initialized``: what ``is_initialized()`` reads, without a call
_Tensor = torch.Tensor
_NO_AUTOCAST = ()
_weakref = weakref.ref
# torch's slot for a module's call (``model.compile()`` puts its compiled call there):
# ``model(...)`` calls what it holds instead of the module's own call path.
_CALL_SLOT = "_compiled_call_impl"
_HAS_CALL_SLOT = getattr(nn.Module, _CALL_SLOT, 0) is None


@dataclass
class _Autocast:
    device_type: str
    dtype: torch.dtype


@dataclass(slots=True)
class ForwardCall:
    """One training forward of the watched model, as the pre-hook saw it."""

    args: tuple
    kwargs: dict[str, Any]
    random_state: RandomState
    autocast: list[_Autocast]
    buffers: list[torch.Tensor]
    in_model_loss: bool = False
    # index in float_tensors(output) -> gradient that arrived there (None until it does),
    # for outputs that are leaves (a tensor hook keeps theirs)
    hooked_grads: dict[int, torch.Tensor | None] = field(default_factory=dict)
    # index -> the output itself, for outputs made by autograd (the common case): autograd
    # keeps their gradient in ``.grad`` (``retain_grad``: no Python call in the backward)
    retained: dict[int, torch.Tensor] = field(default_factory=dict)
    gradient_bytes_over: int | None = None  # the output's gradient was too large to keep
    input_bytes: int = -1  # what its top-level tensor arguments hold (-1: not counted yet)

    @property
    def output_grads(self) -> dict[int, torch.Tensor | None]:
        """index in float_tensors(output) -> the gradient that arrived there (None: none)."""
        found = dict(self.hooked_grads)
        for index, tensor in self.retained.items():
            found[index] = tensor.grad
        return found

    def counted_input_bytes(self) -> int:
        if self.input_bytes < 0:
            self.input_bytes = sum(
                t.numel() * t.element_size()
                for t in (*self.args, *self.kwargs.values())
                if isinstance(t, torch.Tensor)
            )
        return self.input_bytes


def _loss_inside(output: Any) -> bool:
    if isinstance(output, Mapping):
        return isinstance(output.get("loss"), torch.Tensor)
    return isinstance(getattr(output, "loss", None), torch.Tensor)


def _autocast_now() -> list[_Autocast]:
    if not _any_autocast():
        return []  # the common case: one call
    found = []
    for device_type in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device_type):
            found.append(_Autocast(device_type, torch.get_autocast_dtype(device_type)))
    return found


def _fresh_leaf(value: Any) -> Any:
    """A tensor the repeat may run backward through: the step's own graph behind an input
    was freed by its backward, and a leaf input's ``.grad`` is the user's."""
    if isinstance(value, torch.Tensor) and value.requires_grad:
        return value.detach().requires_grad_(True)
    return value


class _ChangingBuffers:
    """The buffers a forward writes (batch-norm statistics), learned at the first forward
    from the buffers' version counters; their values before each forward."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.slots: list[tuple[nn.Module, str]] | None = None
        self._learning: list[tuple[nn.Module, str, int]] = []
        # copies reused from step to step, one set per forward call of a step: one fused
        # copy a forward, no allocation
        self._pool: list[list[torch.Tensor]] = []

    def before_forward(self, index: int) -> list[torch.Tensor]:
        """The values the buffers have now, for the step's ``index``-th forward."""
        if self.slots is None:
            # First forward: every buffer, once; the versions say which ones it wrote.
            self._learning = [
                (owner, name, buffer._version)
                for owner in self.model.modules()
                for name, buffer in owner._buffers.items()
                if buffer is not None
            ]
            return [owner._buffers[name].detach().clone() for owner, name, _ in self._learning]
        if not self.slots:
            return []
        current = [owner._buffers[name] for owner, name in self.slots]
        while len(self._pool) <= index:
            self._pool.append([])
        copies = self._pool[index]
        if len(copies) == len(current):
            try:
                with torch.no_grad():
                    torch._foreach_copy_(copies, current)
                if copies[0].shape == current[0].shape:
                    return copies
            except RuntimeError:  # a buffer replaced by one of another shape or device
                pass
        copies = self._pool[index] = [b.detach().clone() for b in current]
        return copies

    def after_forward(self, call: ForwardCall) -> None:
        if self.slots is not None:
            return
        changed = [
            i
            for i, (owner, name, version) in enumerate(self._learning)
            if owner._buffers.get(name) is not None and owner._buffers[name]._version != version
        ]
        self.slots = [(self._learning[i][0], self._learning[i][1]) for i in changed]
        call.buffers = [call.buffers[i] for i in changed]
        self._learning = []

    def restore(self, values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for (owner, name), value in zip(self.slots or [], values, strict=False):
                buffer = owner._buffers.get(name)
                if buffer is not None and buffer.shape == value.shape:
                    buffer.copy_(value)


class StepReplay:
    """Keeps what repeating the current step's forward needs; see the module docstring.

    ``model``: the user's model (unwrapped). Call :meth:`step_collected` once the step's
    statistics are collected (the next forward starts a new step), :meth:`locate` when a step
    went non-finite and no ``locate=`` was given, and :meth:`close` to remove the hooks."""

    def __init__(self, model: nn.Module, *, max_gradient_bytes: int = DEFAULT_GRADIENT_BYTES):
        self.model = model
        self.max_gradient_bytes = int(max_gradient_bytes)
        # this step's forward calls: ForwardCall, or (args, kwargs, output, autocast) as
        # _take keeps the usual one (read them through _kept_calls)
        self.calls: list[ForwardCall | tuple] = []
        self._buffers = _ChangingBuffers(model)
        self._new_step = True
        self._kept_bytes = 0
        self._warned_too_large = False
        self._current: ForwardCall | None = None
        self.failed: str | None = None  # why the capture stopped, when it did
        # repeating, or the capture failed: the model's calls pass through untouched
        self._off = False
        self.dropped_calls = 0  # this step's earliest forward calls, not kept (till collected)
        # does forward draw from Python's/numpy's generator? None: still learning
        self._host_draws: bool | None = None
        # and from torch's CPU generator (dropout on a CPU)?
        self._cpu_draws: bool | None = None
        self._host_checks_left = HOST_DRAW_CHECKS
        # the outputs whose .grad GradScope asked autograd to keep, until the next step
        self._asked: list[weakref.ref] = []
        # How the calls are taken (see attach): "call", in the model's call slot, or
        # "hooks", by module hooks; None while detached.
        self.mode: str | None = None
        self._entry = self._call  # the one object put in the slot (to tell it apart)
        self._call_impl: Any = None  # the model's own call path, which the entry calls
        self._hooks_only = False
        self._handles: list[Any] = []
        self._pre_handle: Any = None
        self._post_only = False  # the forward's end alone takes the call (nothing before)
        self.attach()

    def __getstate__(self) -> dict[str, Any]:
        """A copy of the watched model (``copy.deepcopy`` for an EMA or reference model,
        ``pickle``) carries the capture's hooks with it, when module hooks take the calls:
        there they do nothing, and the step being captured (which may hold outputs of
        autograd, which cannot be copied) stays behind. (The call slot is not copied at
        all: ``nn.Module.__getstate__`` leaves it out.)"""
        state = dict(self.__dict__)
        state.update(
            calls=[],
            _current=None,
            _handles=[],
            _pre_handle=None,
            _post_only=False,
            _asked=[],
            _entry=None,
            _call_impl=None,
            mode=None,
            failed="a copy of the watched model is not captured",
            _off=True,
        )
        return state

    def attach(self) -> None:
        """Start taking the watched model's training calls (done when it is made).

        The capture sits in torch's slot for a module's call (``_compiled_call_impl``,
        which ``model.compile()`` fills, and which ``model(...)`` calls instead of the
        module's own call path): one Python frame around each call, no module hook on the
        common step, and it sees the call's own arguments and its final output, after any
        hook of the user's. Module hooks take the calls instead where the slot is taken
        (another capture holds it, or ``model.compile()`` after the watch filled it): a
        forward hook, and a forward pre-hook while one is needed. A ``torch.compile(model)``
        made after the watch traces the module's call path itself, past the slot (and
        past hooks added after it): its steps are not captured, as a compiled model's are
        not, and a NaN/Inf step's origin says so.

        What is taken before the forward (the random states, the buffers it writes) is
        learned from the first forwards: once they show that nothing needs keeping (no
        generator drawn from, no buffer written, CUDA not initialised) only the forward's
        end takes the call."""
        if self.mode is not None:
            return
        self._post_only = not self._pre_hook_needed()
        slot = self.model.__dict__.get(_CALL_SLOT)
        if _HAS_CALL_SLOT and not self._hooks_only and slot is None:
            self._call_impl = self.model._call_impl
            self.model.__dict__[_CALL_SLOT] = self._entry
            self.mode = "call"
            return
        self.mode = "hooks"
        self._handles = [self.model.register_forward_hook(self._after_forward, with_kwargs=True)]
        if not self._post_only:
            self._restore_pre_hook()

    def detach(self) -> None:
        """Stop taking calls (the benchmark's watch without the capture); the kept calls go."""
        if self.model.__dict__.get(_CALL_SLOT) is self._entry:
            del self.model.__dict__[_CALL_SLOT]
        self._call_impl = None
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._pre_handle = None
        self.mode = None
        self.step_collected()
        self._let_go_of_gradients()

    def _to_hooks(self) -> None:
        """Module hooks from now on (see :meth:`attach`)."""
        self.detach()
        self._hooks_only = True
        self.attach()

    def _drop_pre_hook(self) -> None:
        """The forward's end alone takes the calls from now on (see :meth:`attach`)."""
        if self._pre_handle is not None:
            self._pre_handle.remove()
            self._handles.remove(self._pre_handle)
            self._pre_handle = None
        self._post_only = True

    def _restore_pre_hook(self) -> None:
        """The calls' start is taken again (while learning, or CUDA initialised after the
        first forwards: its generator is kept again); by module hooks, a pre-hook ahead of
        any other: it sees the call's own arguments."""
        self._post_only = False
        if self.mode == "hooks" and self._pre_handle is None:
            self._pre_handle = self.model.register_forward_pre_hook(
                self._before_forward, with_kwargs=True, prepend=True
            )
            self._handles.insert(0, self._pre_handle)

    # -- capture -------------------------------------------------------------------------
    def _call(self, *args: Any, **kwargs: Any) -> Any:
        """``model(...)`` while the capture holds the model's call slot (see :meth:`attach`)."""
        if self._post_only:
            output = self._call_impl(*args, **kwargs)
            self._take(self.model, args, kwargs, output)
            return output
        self._before_forward(self.model, args, kwargs)
        output = self._call_impl(*args, **kwargs)
        self._finish(output)
        return output

    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._current = None
        if self._off or not torch.is_grad_enabled() or not module.training:
            return  # evaluation, generation, our own repeat, or a capture that failed
        if torch._C._current_graph_task_id() != -1:
            return  # a checkpointed forward recomputed during backward: not a new call
        try:
            self._capture(args, kwargs)
        except Exception as error:  # never the reason a user's forward fails
            self._give_up(error)

    def _after_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self._post_only:
            self._take(module, args, kwargs, output)
        else:  # the pre-hook took the call
            self._finish(output)

    def _finish(self, output: Any) -> None:
        """The end of a call whose start was taken (:meth:`_capture`)."""
        call, self._current = self._current, None
        if call is None:
            return
        try:
            self._prepare_backward(call, output)
        except Exception as error:
            self._give_up(error)

    def _take(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """A call taken at its end alone: the common case once the first forwards are seen.
        It runs inside every training step with the caches cold, where each Python call
        and each object made costs microseconds: the checks are inline here, and the usual
        call (the step's first, one output made by autograd) is kept as a tuple that
        :meth:`_kept_calls` turns into a :class:`ForwardCall` only when one is needed."""
        if (
            self._off
            or not module.training
            or not _grad_enabled()
            or _graph_task_id() != -1  # a checkpointed forward recomputed during backward
        ):
            return
        try:
            if _cuda._initialized:  # CUDA started after the first forwards
                self._restore_pre_hook()  # its generator is kept from the next forward on
            if self._new_step:
                if self._asked:  # the gradients kept at the last step's outputs go
                    self._let_go_of_gradients()
                self._new_step = False
            # (the call's kwargs are its own dict: made for this call, changed by nobody)
            autocast = _autocast_now() if _any_autocast() else _NO_AUTOCAST
            if (
                type(output) is _Tensor
                and output.requires_grad
                and not output.is_leaf
                and not self._kept_bytes
                and output.is_floating_point()
            ):
                size = output.nbytes
                if size <= self.max_gradient_bytes:
                    self._kept_bytes = size
                    if not output.retains_grad:
                        output.retain_grad()
                        self._asked.append(_weakref(output))
                    calls = self.calls
                    calls.append((args, kwargs, output, autocast))
                    if len(calls) > 1:
                        self._bound_calls()
                    return
            call = ForwardCall(
                args,
                kwargs,
                NO_RANDOM_STATE,  # nothing to keep of the generators and buffers
                list(autocast),
                [],
                False,
                {},
                {},
            )
            self._add_call(call)
            self._prepare_backward(call, output)
        except Exception as error:
            self._give_up(error)

    def _kept_calls(self) -> list[ForwardCall]:
        """The step's kept calls, each a :class:`ForwardCall` (those :meth:`_take` kept as
        a tuple become one here)."""
        calls = self.calls
        for index, call in enumerate(calls):
            if type(call) is tuple:
                args, kwargs, output, autocast = call
                calls[index] = ForwardCall(
                    args, kwargs, NO_RANDOM_STATE, list(autocast), [], False, {}, {0: output}
                )
        return calls

    def _give_up(self, error: Exception) -> None:
        """The capture failed on this model: stop capturing (the statistics still say what
        they can, and locate= still works), say so once."""
        self.calls.clear()
        self.failed = f"{type(error).__name__}: {error}"
        self._off = True
        warn_user(
            f"gradscope.watch: capturing the step for a NaN/Inf re-run failed ({self.failed}); "
            "NaN/Inf steps without locate= are found from the statistics"
        )

    def _capture(self, args: tuple, kwargs: dict) -> None:
        """The capture of a call's start (while learning, or when the forward draws from a
        generator or writes a buffer): the call, with the generators and buffers."""
        if self._new_step:
            self._let_go_of_gradients()
            self._new_step = False
        random_state = capture_random_state(
            host=self._host_draws is not False, torch_cpu=self._cpu_draws is not False
        )
        buffers = self._buffers.before_forward(len(self.calls))
        call = ForwardCall(
            args, dict(kwargs), random_state, _autocast_now(), buffers, False, {}, {}
        )
        self._add_call(call)
        self._current = call

    def _add_call(self, call: ForwardCall) -> None:
        """One more forward call of this step (see :meth:`_bound_calls`). The usual call
        of :meth:`_take` is appended there, inline."""
        calls = self.calls
        calls.append(call)
        if len(calls) > 1:
            self._bound_calls()

    def _bound_calls(self) -> None:
        """Micro-batches: the step's kept inputs are bounded too (the latest call stays)."""
        calls = self._kept_calls()
        held = sum(c.counted_input_bytes() for c in calls[:-1])
        while len(calls) > 1 and (
            len(calls) > MAX_CALLS_PER_STEP or held > self.max_gradient_bytes
        ):
            held -= calls.pop(0).counted_input_bytes()
            self.dropped_calls += 1

    def _prepare_backward(self, call: ForwardCall, output: Any) -> None:
        if not self._post_only:  # still learning what the pre-hook keeps
            if self._buffers.slots is None:
                self._buffers.after_forward(call)
            if self._host_checks_left > 0:
                self._learn_host_draws(call)
        if isinstance(output, torch.Tensor):  # the common case, without a tree walk
            if not (output.requires_grad and output.is_floating_point()):
                return
            outputs = [(0, output)]
            size = output.nbytes
        elif _loss_inside(output):
            call.in_model_loss = True
            return
        else:
            outputs = [(i, t) for i, t in enumerate(float_tensors(output)) if t.requires_grad]
            size = sum(t.nbytes for _, t in outputs)
        # the step's micro-batches share the bound
        if size + self._kept_bytes > self.max_gradient_bytes:
            call.gradient_bytes_over = size
            if not self._warned_too_large:
                self._warned_too_large = True
                warn_user(
                    f"gradscope.watch: the gradient at the model's output ({size / 2**20:.0f} "
                    f"MiB a step) is over max_gradient_bytes ({self.max_gradient_bytes / 2**20:.0f}"
                    " MiB), so it is not kept: a NaN/Inf step without locate= is then found "
                    "from the statistics only (raise max_gradient_bytes, or pass locate=)"
                )
            return
        self._kept_bytes += size
        for index, tensor in outputs:
            if tensor.is_leaf:
                call.hooked_grads[index] = None
                tensor.register_hook(_tensor_keeper(call, index))
                continue
            # autograd keeps the gradient in .grad, with no Python call in the backward (a
            # node pre-hook cost some 60 µs a step with the caches cold; a backward run
            # twice, retain_graph, sums its parts there as well)
            if not tensor.retains_grad:
                tensor.retain_grad()
                self._asked.append(weakref.ref(tensor))
            call.retained[index] = tensor

    def _learn_host_draws(self, call: ForwardCall) -> None:
        """Whether the forward draws from torch's CPU generator, Python's or numpy's, from
        the first forwards: a snapshot of each costs from a few to tens of microseconds a
        step, more inside a training loop whose forward and backward leave the caches
        cold. A generator the forward drew from once stays captured for good."""
        if self._host_draws is None and call.random_state.host_generators_moved():
            self._host_draws = True
        if self._cpu_draws is None and call.random_state.torch_cpu_moved():
            self._cpu_draws = True
        self._host_checks_left -= 1
        if self._host_checks_left <= 0:
            self._host_draws = bool(self._host_draws)
            self._cpu_draws = bool(self._cpu_draws)
            if not self._pre_hook_needed():
                self._drop_pre_hook()

    def _pre_hook_needed(self) -> bool:
        """Whether the pre-hook keeps anything: still learning, a forward that draws from a
        generator or writes a buffer, or CUDA initialised (its generator is always kept)."""
        return bool(
            self._host_checks_left > 0
            or self._buffers.slots is None
            or self._host_draws
            or self._cpu_draws
            or self._buffers.slots
            or torch.cuda.is_initialized()
        )

    def _let_go_of_gradients(self) -> None:
        """The gradients at the last step's outputs that GradScope asked autograd to keep
        (``retain_grad``) go, as the next step begins: an output the user still holds
        drops its ``.grad`` then (it lived one step, as the user's own output does), one
        the user let go of took its gradient with it."""
        for ref in self._asked:
            tensor = ref()
            if tensor is not None:
                tensor.grad = None
        self._asked = []

    def step_collected(self) -> None:
        """The step's statistics are in (and its origin, if it needed one): its calls are
        let go now, so the batch and kept gradients live no longer than the step."""
        if self.mode == "call" and self.model.__dict__.get(_CALL_SLOT) is not self._entry:
            self._to_hooks()  # model.compile() after the watch took the slot (see attach)
        self.calls.clear()
        self._kept_bytes = 0
        self.dropped_calls = 0
        self._new_step = True

    # -- repeat --------------------------------------------------------------------------
    def locate(
        self,
        wrapped_model: nn.Module,
        stats: StepStats,
        layer_names: list[str],
        *,
        batch: Any = None,
        timeout: float,
    ) -> Origin:
        """Where this step's first NaN/Inf came from, by repeating its forward calls in
        order (the first one located wins). Never raises for GradScope's own reasons."""
        calls = list(self._kept_calls())
        if not calls:
            origin = statistics_origin(stats, layer_names)
            origin.details["reason"] = (
                f"the step could not be captured ({self.failed}): pass locate="
                if self.failed
                else "no training forward of the watched model was seen in this step (a "
                "training_step or loss that calls submodules directly, or a torch.compile of "
                "the model made after the watch?): pass locate="
            )
            return origin
        deadline = time.monotonic() + timeout
        last: Origin | None = None
        for number, call in enumerate(calls):
            origin = locate_safely(
                wrapped_model,
                self._repeat(call),
                stats,
                layer_names,
                batch=batch,
                timeout=max(deadline - time.monotonic(), 0.0),
                repeated=True,
            )
            if origin.phase != "unknown":
                origin.details["repeated"] = "captured step"
                if len(calls) > 1:
                    origin.details["forward_call"] = number
                return origin
            last = origin
            if "took longer" in origin.details.get("reason", ""):
                break
        assert last is not None
        return self._explain(last, calls, stats, layer_names)

    def _explain(
        self, last: Origin, calls: list[ForwardCall], stats: StepStats, layer_names: list[str]
    ) -> Origin:
        """Why a repeat that stayed finite found nothing, where the capture knows better."""
        if not last.details.get("finite"):
            return last
        if self.dropped_calls:
            last.details["reason"] += (
                f"; the step's first {self.dropped_calls} forward call(s) were not kept "
                f"(over {MAX_CALLS_PER_STEP} calls or max_gradient_bytes of inputs), so "
                "were not repeated"
            )
        over = [c.gradient_bytes_over for c in calls if c.gradient_bytes_over is not None]
        if over and not any(c.in_model_loss for c in calls):
            origin = statistics_origin(stats, layer_names)
            origin.details["reason"] = (
                f"the model's forward was repeated and stayed finite; its backward was not: "
                f"the gradient at its output ({max(over) / 2**20:.0f} MiB) is over "
                f"max_gradient_bytes ({self.max_gradient_bytes / 2**20:.0f} MiB), so it was "
                "not kept (raise max_gradient_bytes, or pass locate=)"
            )
            return origin
        broken = [
            c
            for c in calls
            if not c.in_model_loss
            and any(
                g is not None and not bool(torch.isfinite(g).all()) for g in c.output_grads.values()
            )
        ]
        if broken:
            origin = statistics_origin(stats, layer_names)
            origin.details["reason"] = (
                "the model's forward was repeated and stayed finite, and the gradient arriving "
                "at its output was already NaN/Inf: the loss code outside the model made it "
                "(pass locate=<a function recomputing the loss> to collect() to name its line)"
            )
            return origin
        return last

    def _repeat(self, call: ForwardCall):
        """The ``locate`` function that repeats ``call``: the same inputs, random state,
        autocast and buffers; it returns the model's output when the model computes its
        loss, else a scalar whose gradient at the output is the kept one."""

        def repeat() -> Any:
            restore_random_state(call.random_state)
            self._buffers.restore(call.buffers)
            args = tree_map(_fresh_leaf, call.args)
            kwargs = tree_map(_fresh_leaf, call.kwargs)
            self._off = True
            try:
                with _autocast(call.autocast):
                    output = self.model(*args, **kwargs)
            finally:
                self._off = self.failed is not None
            if call.in_model_loss:
                return output
            return _backward_from_kept(output, call)

        return repeat

    def close(self) -> None:
        self.detach()


def _store(call: ForwardCall, index: int, grad: torch.Tensor) -> None:
    kept = call.hooked_grads.get(index)
    # a backward run twice (retain_graph) sends the gradient in parts: their sum is it
    call.hooked_grads[index] = grad if kept is None else kept + grad


def _tensor_keeper(call: ForwardCall, index: int):
    def keep(grad: torch.Tensor) -> None:
        _store(call, index, grad)

    return keep


class _autocast:
    """The autocast the step's forward ran under (none, CPU, CUDA or both)."""

    def __init__(self, settings: list[_Autocast]) -> None:
        self.contexts = [torch.autocast(s.device_type, dtype=s.dtype) for s in settings]

    def __enter__(self) -> None:
        for context in self.contexts:
            context.__enter__()

    def __exit__(self, *exc: object) -> None:
        for context in reversed(self.contexts):
            context.__exit__(*exc)


def _backward_from_kept(output: Any, call: ForwardCall) -> torch.Tensor:
    """A scalar whose backward sends the kept gradient into each output: sum(output * grad),
    made outside the tracer (it is GradScope's, not an operation of the user's). With no
    usable gradient (none kept, or one already NaN/Inf) a constant: the repeat then checks
    the forward only."""
    outputs = float_tensors(output)
    pairs = [
        (outputs[i], grad)
        for i, grad in call.output_grads.items()
        if grad is not None and i < len(outputs) and outputs[i].shape == grad.shape
    ]
    with torch._C.DisableTorchFunction():
        if not pairs or not all(bool(torch.isfinite(g).all()) for _, g in pairs):
            return torch.zeros(())
        total = None
        for tensor, grad in pairs:
            part = (tensor.double() * grad.detach().double()).sum()
            total = part if total is None else total + part
        return total


def make_replay(
    wrapped_model: nn.Module, *, enabled: bool = True, max_gradient_bytes: int
) -> StepReplay | None:
    """The watch's replay of ``wrapped_model``, or None where a repeat cannot run or must
    not be captured: turned off, a compiled model (hooks on it would break its graph), one
    inside ``nn.DataParallel``, a sharded one (its forward needs every rank; the statistics
    say so)."""
    if not enabled:
        return None
    chain = wrapper_chain(wrapped_model)
    model = unwrap_model(wrapped_model)
    if any(hasattr(m, "_orig_mod") for m in chain) or _compiled_in_place(model):
        return None
    if any(isinstance(m, nn.DataParallel) for m in chain):
        return None  # its replicas call the root's hooks from threads
    if sharded_reason(model) is not None:
        return None
    return StepReplay(model, max_gradient_bytes=max_gradient_bytes)


def _compiled_in_place(model: nn.Module) -> bool:
    """``model.compile()`` filled its call slot (a capture's entry there is not a compile)."""
    held = model.__dict__.get(_CALL_SLOT)
    return held is not None and not isinstance(getattr(held, "__self__", None), StepReplay)
