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
  that arrives at the model's output, kept by autograd (``retain_grad``) until the step is
  collected. The kept gradients of a step are bounded by ``max_gradient_bytes``: a larger
  output is not kept (the watch says so once) and its step falls back to the statistics,
  naming the reason.

Nothing more is held (issue #34): a forward whose backward never ran keeps no graph alive
(its outputs are let go at the next forward), and a capture dropped without
``close()`` leaves the model (the slot and hooks hold it weakly). ``torch.compile`` never
traces the capture (:func:`_keep_out_of_tracing`), which takes the calls where their
arguments lie outside the compiled region.

None of it synchronises with the device. When a step goes non-finite, :meth:`StepReplay.locate`
repeats each of the step's forward calls (micro-batches: each in turn) through
:func:`gradscope.core.safe_locate.locate_safely`, which bounds it in time, runs no
collective and, through :mod:`gradscope.core.invisible_rerun`, starts the repeat from the
call's random state and buffers and puts back the weights, buffers, gradients and random
generators after it.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from gradscope.core.facts import Origin, StepStats
from gradscope.core.invisible_rerun import start_from
from gradscope.core.rng import (
    NO_RANDOM_STATE,
    RandomState,
    capture_random_state,
    cuda_started,
)
from gradscope.core.safe_locate import locate_safely, statistics_origin
from gradscope.core.tensor_tree import float_tensors
from gradscope.core.user_warnings import warn_user
from gradscope.core.wrappers import sharded_reason, wrapper_chain

DEFAULT_GRADIENT_BYTES = 256 * 2**20
# Forward calls of one step kept for the repeat (micro-batches); older ones are dropped,
# also once the inputs they keep alive pass max_gradient_bytes (the latest is always kept).
MAX_CALLS_PER_STEP = 16
# Forwards that show whether the model draws from Python's or numpy's generator.
HOST_DRAW_CHECKS = 3


_any_autocast = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled
_graph_task_id = torch._C._current_graph_task_id
_Tensor = torch.Tensor
_NO_AUTOCAST = ()
_weakref = weakref.ref
# torch's slot for a module's call (``model.compile()`` puts its compiled call there):
# ``model(...)`` calls what it holds instead of the module's own call path.
_CALL_SLOT = "_compiled_call_impl"
_HAS_CALL_SLOT = getattr(nn.Module, _CALL_SLOT, 0) is None


def _keep_out_of_tracing(function: Any, *, traces_inside: bool = False) -> Any:
    """Keep dynamo (``torch.compile``) from tracing ``function``, at no cost a call.

    A compiled call can reach the capture two ways: as a Python frame that dynamo's frame
    hook compiles (the call slot's entry, called inside the context of a ``torch.compile``
    made after the watch), and inlined into a traced ``_call_impl`` (module hooks under
    ``model.compile()``). Traced, the capture's reads (CUDA's generator above all) made
    dynamo raise into the user's training on CUDA. The function's code is marked for the
    frame hook to skip (with what it calls, unless ``traces_inside``: the entry's call of
    the model itself stays compiled), and ``_torchdynamo_disable`` makes a tracer that meets
    it break the graph and call it eagerly, as ``torch.compiler.disable`` does; unlike
    that decorator, no wrapper frame, and no import of ``torch._dynamo`` (a second) at
    ``import gradscope``."""
    target = getattr(function, "__func__", function)
    target._torchdynamo_disable = True
    eval_frame = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    strategy = getattr(eval_frame, "_FrameExecStrategy", None)
    action = getattr(eval_frame, "_FrameAction", None)
    if strategy is not None and action is not None:
        inside = action.DEFAULT if traces_inside else action.SKIP
        eval_frame.set_code_exec_strategy(target.__code__, strategy(action.SKIP, inside))
    return function


def _capture_entry(replay: StepReplay, call_impl: Any) -> Any:
    """What the capture puts in the call slot: the model's call (``call_impl``: the module's
    own call path, or the compiled call ``model.compile()`` put there) between the
    capture's two halves. It holds the capture by a weak reference, so that a watch
    dropped without ``close()`` leaves the model (see :meth:`StepReplay.attach`)."""
    owner = weakref.ref(replay)

    def gradscope_capture(*args: Any, **kwargs: Any) -> Any:
        capture = owner()
        if capture is None:
            return call_impl(*args, **kwargs)
        if capture.calls:  # not the step's first forward (see _let_go_of_unused_graphs)
            capture._let_go_of_unused_graphs()
        if capture._post_only:
            output = call_impl(*args, **kwargs)
            capture._take(args, kwargs, output)
            return output
        capture._before_forward(args, kwargs)
        output = call_impl(*args, **kwargs)
        capture._finish(output)
        return output

    gradscope_capture.gradscope_replay = owner  # type: ignore[attr-defined]
    return _keep_out_of_tracing(gradscope_capture, traces_inside=True)


def _capture_hooks(replay: StepReplay) -> tuple[Any, Any]:
    """The module hooks that take the calls where the slot is not used (a weak reference to
    the capture, as the slot's entry holds): the pre-hook and the forward hook. A copy of
    the model (``copy.deepcopy``: an EMA or reference model) carries them along: there
    they do nothing."""
    owner = weakref.ref(replay)

    def gradscope_before(module: nn.Module, args: tuple, kwargs: dict) -> None:
        capture = owner()
        if capture is not None and capture.host is module:
            capture._before_forward(args, kwargs)

    def gradscope_after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        capture = owner()
        if capture is not None and capture.host is module:
            capture._after_forward(args, kwargs, output)

    return _keep_out_of_tracing(gradscope_before), _keep_out_of_tracing(gradscope_after)


def _capture_holding(slot: Any) -> StepReplay | None:
    """The capture whose entry ``slot`` is (None: empty, a compile's, or a capture gone)."""
    owner = getattr(slot, "gradscope_replay", None)
    return owner() if owner is not None else None


def _let_go_of_model(host_ref: weakref.ref, entry: Any, wrapped: Any, handles: list) -> None:
    """A capture collected without close(): the model's call slot gets back what the entry
    wrapped, and its hooks go."""
    host = host_ref()
    if entry is not None and host is not None and host.__dict__.get(_CALL_SLOT) is entry:
        if wrapped is None:
            del host.__dict__[_CALL_SLOT]
        else:
            host.__dict__[_CALL_SLOT] = wrapped
    for handle in handles:
        handle.remove()


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
    # keeps their gradient in ``.grad`` (``retain_grad``: no Python call in the backward);
    # moved to hooked_grads once a later forward came before this one's backward (see
    # let_go_of_outputs)
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

    def let_go_of_outputs(self) -> int:
        """The outputs are let go, when no gradient reached them yet (a forward whose
        backward has not run: a skipped batch's graph would otherwise live on); the bytes
        their gradients would have taken. A backward still to come (two forwards, one loss)
        sends their gradients to a tensor hook, which lives in the graph itself: it goes
        with the graph, and it keeps nothing of it. (A hook costs some 25 µs to register:
        only here, never on the common step.)"""
        outputs = list(self.retained.items())
        if not outputs or any(t.grad is not None for _, t in outputs):
            return 0
        for index, tensor in outputs:
            self.hooked_grads[index] = None
            tensor.register_hook(_tensor_keeper(self, index))
        self.retained = {}
        return sum(t.nbytes for _, t in outputs)

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

    def named(self, values: list[torch.Tensor]) -> list[tuple[nn.Module, str, torch.Tensor]]:
        """``values`` (a forward's copies) with the buffers they are the values of."""
        slots = self.slots or []
        return [(owner, name, value) for (owner, name), value in zip(slots, values, strict=False)]


class StepReplay:
    """Keeps what repeating the current step's forward needs; see the module docstring.

    ``model``: the user's model (unwrapped). Call :meth:`step_collected` once the step's
    statistics are collected (the next forward starts a new step), :meth:`locate` when a step
    went non-finite and no ``locate=`` was given, and :meth:`close` to remove the hooks."""

    def __init__(
        self,
        model: nn.Module,
        *,
        max_gradient_bytes: int = DEFAULT_GRADIENT_BYTES,
        host: nn.Module | None = None,
    ):
        self.model = model
        # The module whose calls are taken: the model, or the torch.compile wrapper around
        # it (its call arguments are outside the compiled region; see attach).
        self.host = model if host is None else host
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
        # and from torch's CPU generator (dropout on a CPU)? from a CUDA generator (None
        # too while CUDA was not initialised during the learning forwards)?
        self._cpu_draws: bool | None = None
        self._cuda_draws: bool | None = None
        self._host_checks_left = HOST_DRAW_CHECKS
        # the outputs whose .grad GradScope asked autograd to keep, until the step is collected
        self._asked: list[weakref.ref] = []
        # How the calls are taken (see attach): "call", in the model's call slot, or
        # "hooks", by module hooks; None while detached.
        self.mode: str | None = None
        self._entry: Any = None  # the one object put in the slot (to tell it apart)
        self._call_impl: Any = None  # the call the entry makes (the module's, or a compile's)
        self._wrapped: Any = None  # what the slot held before the entry (a compile's call)
        self._hooks_only = False
        self._hooks: tuple[Any, ...] = ()  # the module hooks, where they take the calls
        self._handles: list[Any] = []
        self._pre_handle: Any = None
        self._post_only = False  # the forward's end alone takes the call (nothing before)
        self._finalizer: weakref.finalize | None = None
        self.attach()

    def __getstate__(self) -> dict[str, Any]:
        """A copy of the watched model (``copy.deepcopy`` for an EMA or reference model,
        ``pickle``) carries nothing of the capture: the call slot is not copied
        (``nn.Module.__getstate__`` leaves it out), and the capture's module hooks, copied
        with the model, look only at the module they were put on. This copy of the capture
        (for a copy made some other way) is inert."""
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
            _wrapped=None,
            _finalizer=None,
            mode=None,
            failed="a copy of the watched model is not captured",
            _off=True,
        )
        return state

    def attach(self) -> None:
        """Start taking the watched model's training calls (done when it is made).

        The capture sits in torch's slot for a module's call (``_compiled_call_impl``,
        which ``model(...)`` calls instead of the module's own call path): one Python frame
        around each call, no module hook on the common step, and it sees the call's own
        arguments and its final output, after any hook of the user's. Where the slot holds
        the compiled call of ``model.compile()`` (made before the watch, or after it: seen
        at the next ``collect()``), the entry calls that: the arguments and the output are
        still outside the compiled region. A watch of ``torch.compile(model)`` takes the
        compiled wrapper's calls, whose arguments are outside its compiled region too.
        Dynamo never traces the capture (see :func:`_keep_out_of_tracing`).

        A ``torch.compile(model)`` made after the watch compiles the model's call path
        itself: a model whose class is torch's own (``nn.Sequential``) is traced past the
        slot, so its steps are not captured and a NaN/Inf step's origin says so; another
        model's entry still runs, outside the compiled region.

        The slot holds the capture weakly: a new watch of the model takes over from an
        earlier capture still in the slot (and warns), and a watch dropped without
        ``close()`` leaves the model as it was. Module hooks take the calls only where torch
        has no call slot (or by :meth:`_to_hooks`).

        What is taken before the forward (the random states, the buffers it writes) is
        learned from the first forwards: once they show that nothing needs keeping (no
        generator drawn from, no buffer written) only the forward's end takes the call."""
        if self.mode is not None:
            return
        self._post_only = not self._pre_hook_needed()
        host = self.host
        if _HAS_CALL_SLOT and not self._hooks_only:
            earlier = _capture_holding(host.__dict__.get(_CALL_SLOT))
            if earlier is not None and earlier is not self:
                earlier._taken_over()
            self._wrapped = host.__dict__.get(_CALL_SLOT)
            self._call_impl = self._wrapped if self._wrapped is not None else host._call_impl
            self._entry = _capture_entry(self, self._call_impl)
            host.__dict__[_CALL_SLOT] = self._entry
            self.mode = "call"
        else:
            self.mode = "hooks"
            self._hooks = _capture_hooks(self)
            self._handles = [host.register_forward_hook(self._hooks[1], with_kwargs=True)]
            if not self._post_only:
                self._restore_pre_hook()
        self._finalizer = weakref.finalize(
            self, _let_go_of_model, weakref.ref(host), self._entry, self._wrapped, self._handles
        )
        self._finalizer.atexit = False  # nothing to put back in a process that ends

    def detach(self) -> None:
        """Stop taking calls (the benchmark's watch without the capture); the kept calls go."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _let_go_of_model(weakref.ref(self.host), self._entry, self._wrapped, self._handles)
        self._entry = self._call_impl = self._wrapped = None
        self._handles = []
        self._pre_handle = None
        self.mode = None
        self.step_collected()

    def _taken_over(self) -> None:
        """A newer watch of the model takes the calls from this capture (the earlier watch
        was not closed: a notebook cell run again, a watch per epoch): it stops, and says
        so once."""
        self.detach()
        self.failed = "a newer watch of the model took over its capture"
        self._off = True
        warn_user(
            "gradscope.watch: a newer watch of this model takes over the capture of an earlier "
            "one that was not closed (its NaN/Inf steps are found from the statistics from now "
            "on); close() a watch, or use it as a context manager, before watching again"
        )

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
        first forwards: whether the forward draws from its generator is learned again); by
        module hooks, a pre-hook ahead of any other: it sees the call's own arguments."""
        self._post_only = False
        if self.mode == "hooks" and self._pre_handle is None:
            self._pre_handle = self.host.register_forward_pre_hook(
                self._hooks[0], with_kwargs=True, prepend=True
            )
            self._handles.insert(0, self._pre_handle)

    # -- capture (kept out of dynamo's tracing: see _keep_out_of_tracing) ------------------
    def _before_forward(self, args: tuple, kwargs: dict) -> None:
        self._current = None
        if self._off or not torch.is_grad_enabled() or not self.model.training:
            return  # evaluation, generation, our own repeat, or a capture that failed
        if torch._C._current_graph_task_id() != -1:
            return  # a checkpointed forward recomputed during backward: not a new call
        try:
            self._capture(args, kwargs)
        except Exception as error:  # never the reason a user's forward fails
            self._give_up(error)

    def _after_forward(self, args: tuple, kwargs: dict, output: Any) -> None:
        if self._post_only:
            self._take(args, kwargs, output)
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

    def _take(self, args: tuple, kwargs: dict, output: Any) -> None:
        """A call taken at its end alone: the common case once the first forwards are seen.
        It runs inside every training step with the caches cold, where each Python call
        and each object made costs microseconds: the checks are inline here, and the usual
        call (the step's first, one output made by autograd) is kept as a tuple that
        :meth:`_kept_calls` turns into a :class:`ForwardCall` only when one is needed."""
        if (
            self._off
            or not self.model.training
            or not _grad_enabled()
            or _graph_task_id() != -1  # a checkpointed forward recomputed during backward
        ):
            return
        try:
            if self._cuda_draws is None and cuda_started():  # CUDA started after learning
                self._host_checks_left = HOST_DRAW_CHECKS  # learn whether forward draws there
                self._restore_pre_hook()  # from the next forward on
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

    # gradscope attach hands over by hand the call that was under way when it made this
    # capture (the capture's own entry takes the next ones), and reads the step's calls.
    start_call = _before_forward
    end_call = _after_forward
    kept_calls = _kept_calls

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
            host=self._host_draws is not False,
            torch_cpu=self._cpu_draws is not False,
            cuda=self._cuda_draws is not False,
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
        """A second forward call in a step: micro-batches, or a forward whose backward never
        ran (a batch skipped for a non-finite loss, an out-of-memory error caught, a
        validation pass in training mode). An earlier call that no gradient reached holds
        no output from now on, so that the capture keeps no graph alive (a backward still
        to come, two forwards and one loss, still sends their gradients: see
        ForwardCall.let_go_of_outputs). The step's kept inputs are bounded too (the latest
        call stays)."""
        calls = self._kept_calls()
        for call in calls[:-1]:  # (already done before the forward, from the call slot)
            self._kept_bytes -= call.let_go_of_outputs()
        held = sum(c.counted_input_bytes() for c in calls[:-1])
        while len(calls) > 1 and (
            len(calls) > MAX_CALLS_PER_STEP or held > self.max_gradient_bytes
        ):
            held -= calls.pop(0).counted_input_bytes()
            self.dropped_calls += 1

    def _let_go_of_unused_graphs(self) -> None:
        """Before a forward that is not the step's first: the earlier calls that no gradient
        reached let go of their outputs (see :meth:`_bound_calls`), so that a graph the
        user let go of (a skipped batch) is freed before this forward makes its own, not
        after: the capture never doubles the peak of a step."""
        try:
            for call in self._kept_calls():
                self._kept_bytes -= call.let_go_of_outputs()
        except Exception as error:
            self._give_up(error)

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
        """Whether the forward draws from torch's CPU generator, a CUDA generator, Python's
        or numpy's, from the first forwards: a snapshot of each costs from a few to tens of
        microseconds a step (CUDA's about 4 µs on an H200, 2.6% of a small model's step
        there), more inside a training loop whose forward and backward leave the caches
        cold. A generator the forward drew from once stays captured for good."""
        state = call.random_state
        if self._host_draws is None and state.host_generators_moved():
            self._host_draws = True
        if self._cpu_draws is None and state.torch_cpu_moved():
            self._cpu_draws = True
        if self._cuda_draws is None and state.torch_cuda_moved():
            self._cuda_draws = True
        self._host_checks_left -= 1
        if self._host_checks_left <= 0:
            self._host_draws = bool(self._host_draws)
            self._cpu_draws = bool(self._cpu_draws)
            if state.torch_cuda is not None:  # CUDA was there to be seen
                self._cuda_draws = bool(self._cuda_draws)
            if not self._pre_hook_needed():
                self._drop_pre_hook()

    def _pre_hook_needed(self) -> bool:
        """Whether the pre-hook keeps anything: still learning, a forward that draws from a
        generator or writes a buffer, or CUDA initialised and not yet learned about."""
        return bool(
            self._host_checks_left > 0
            or self._buffers.slots is None
            or self._host_draws
            or self._cpu_draws
            or self._cuda_draws
            or self._buffers.slots
            or (self._cuda_draws is None and cuda_started())
        )

    def _let_go_of_gradients(self) -> None:
        """The gradients at the step's outputs that GradScope asked autograd to keep
        (``retain_grad``) go, once the step is collected: an output the user still holds
        drops its ``.grad`` then, one the user let go of took its gradient with it. (An
        output the user called ``retain_grad()`` on inside the forward, before the capture
        saw it, keeps its ``.grad``: the capture did not ask for that one.)"""
        for ref in self._asked:
            tensor = ref()
            if tensor is not None:
                tensor.grad = None
        self._asked = []

    def step_collected(self) -> None:
        """The step's statistics are in (and its origin, if it needed one): its calls, and
        the gradients kept at its outputs, are let go now, so the batch and the output's
        gradient live no longer than the step."""
        if self.mode == "call" and self.host.__dict__.get(_CALL_SLOT) is not self._entry:
            # model.compile() after the watch put its compiled call in the slot: the entry
            # goes back in front of it (see attach)
            self.detach()
            self.attach()
        self.calls.clear()
        if self._asked:
            self._let_go_of_gradients()
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
            return self._not_captured(stats, layer_names)
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

    def _not_captured(self, stats: StepStats, layer_names: list[str]) -> Origin:
        """The origin of a step none of whose forward calls was captured: the statistics'
        (and why). After a ``torch.compile`` the loss's NaN/Inf may as well be the batch's,
        so the statistics' "loss" is no claim then: the phase is "unknown"."""
        origin = statistics_origin(stats, layer_names)
        if self.failed:
            origin.details["reason"] = (
                f"the step could not be captured ({self.failed}): pass locate="
            )
            return origin
        compiled = "torch._dynamo" in sys.modules  # imported by every torch.compile
        if not compiled:
            origin.details["reason"] = (
                "no training forward of the watched model was seen in this step (a "
                "training_step or loss that calls submodules directly?): pass locate="
            )
            return origin
        if origin.phase == "loss":
            origin.details["statistics_phase"] = "loss"
            origin.phase = "unknown"
        if self.mode == "call" and self.host.__dict__.get(_CALL_SLOT) is not self._entry:
            origin.details["reason"] = (
                "no training forward of the watched model was seen in this step: a "
                "model.compile() made after the watch replaced the capture's entry, which "
                "goes back in front of the compiled call from the next step on; for this "
                "step, neither the batch, the model nor the loss can be named: pass locate="
            )
            return origin
        origin.details["reason"] = (
            "no training forward of the watched model was seen in this step: a "
            "torch.compile(model) made after the watch compiles the model's call with the "
            "capture left out, so neither the batch, the model nor the loss can be named. "
            "Watch the compiled model instead (gradscope.watch(torch.compile(model)), or "
            "model.compile() before or after the watch), or pass locate="
        )
        return origin

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
            start_from(call.random_state, self._buffers.named(call.buffers))
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
    not be captured: turned off, a model inside ``nn.DataParallel``, a sharded one (its
    forward needs every rank; the statistics say so). Of a ``torch.compile`` wrapper the
    calls are taken at the wrapper nearest the model (its arguments are the model's, outside
    the compiled region); the repeat runs the eager model."""
    if not enabled:
        return None
    chain = wrapper_chain(wrapped_model)
    model = chain[-1]
    if any(isinstance(m, nn.DataParallel) for m in chain):
        return None  # its replicas call the root's hooks from threads
    if sharded_reason(model) is not None:
        return None
    compiled = [m for m in chain[:-1] if isinstance(getattr(m, "_orig_mod", None), nn.Module)]
    host = compiled[-1] if compiled else model
    return StepReplay(model, max_gradient_bytes=max_gradient_bytes, host=host)


# The capture's halves are what a compiled call can reach (from the slot's entry, or as
# module hooks): kept out of dynamo's tracing with all they call.
for _half in (
    StepReplay._let_go_of_unused_graphs,
    StepReplay._before_forward,
    StepReplay._after_forward,
    StepReplay._finish,
    StepReplay._take,
):
    _keep_out_of_tracing(_half)
