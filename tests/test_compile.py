"""torch.compile in every order (issue #34): the watch made before or after compiling, by
``torch.compile(model)`` or ``model.compile()``. The watch never raises into training,
dynamo never traces GradScope's own capture, the statistics stay exact, and a NaN in the
batch is named as the batch's (from an eager repeat of the captured call) or, where the
call could not be seen, the origin's phase is "unknown" with a reason naming the compile.

Backend: ``"eager"`` throughout. What is tested (where the capture sits, what dynamo traces
and skips, which frames run eagerly) is dynamo's frame handling, the same for every
backend; the statistics test uses ``"aot_eager"``, whose compiled autograd graph makes the
gradients that the watch reads. CUDA's ``mode="reduce-overhead"`` is in tests/test_cuda.py.
"""

import gc
import weakref

import pytest
import torch
from torch import nn

import gradscope
from gradscope.core import replay as replay_module
from gradscope.core import rng


class Net(nn.Module):
    """A model class of the user's own (not torch's, as ``nn.Sequential`` is: dynamo treats
    the two differently at the top of a compiled call)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 4)
        self.second = nn.Linear(4, 1)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def _build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "net":
        return Net()
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


def _watch_in_order(order: str, model: nn.Module, backend: str = "eager", **options):
    """(watch, the callable the training loop calls) for one order of watch and compile."""
    if order == "torch.compile, then watch":
        compiled = torch.compile(model, backend=backend)
        return gradscope.watch(compiled, **options), compiled
    if order == "watch, then torch.compile":
        watch = gradscope.watch(model, **options)
        return watch, torch.compile(model, backend=backend)
    if order == "model.compile(), then watch":
        model.compile(backend=backend)
        return gradscope.watch(model, **options), model
    assert order == "watch, then model.compile()"
    watch = gradscope.watch(model, **options)
    model.compile(backend=backend)
    return watch, model


ORDERS = [
    "torch.compile, then watch",
    "watch, then torch.compile",
    "model.compile(), then watch",
    "watch, then model.compile()",
]


def _steps_with_a_nan_batch(watch, call, model, steps: int = 4):
    found = []
    for step in range(steps):
        x = torch.randn(4, 3)
        if step == steps - 1:
            x[2, 1] = float("nan")  # the batch is the culprit
        model.zero_grad()
        loss = call(x).square().mean()
        loss.backward()
        found.append(watch.collect(loss))
    return found


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


CASES = [
    (order, kind)
    for order in ORDERS
    for kind in ("net", "sequential")
    if (order, kind) != ("watch, then torch.compile", "sequential")  # the test below
]


@pytest.mark.parametrize(("order", "kind"), CASES)
def test_a_nan_in_the_batch_is_named_as_the_batchs_in_every_order(order, kind):
    """Where the compiled call's arguments are seen (outside the compiled region), the
    eager repeat names the batch: phase "input", sample 2. Before, a compiled
    ``nn.Sequential`` had its NaN batch blamed on the loss, and a model compiled in place
    was not captured at all."""
    model = _build(kind)
    watch, call = _watch_in_order(order, model)
    found = _steps_with_a_nan_batch(watch, call, model)
    watch.close()
    assert not any(s.nonfinite for s in found[:-1])
    origin = found[-1].origin
    assert found[-1].nonfinite
    assert origin.phase == "input", (order, origin)
    assert origin.details["samples"] == [2]
    assert origin.details["repeated"] == "captured step"
    # close() left the model's call slot empty, or with the compile's own call
    assert not hasattr(model.__dict__.get("_compiled_call_impl"), "gradscope_replay")


def test_a_torch_module_compiled_after_the_watch_is_not_blamed_on_the_loss():
    """``torch.compile(nn.Sequential(...))`` after the watch: dynamo traces torch's own
    module class from the top, past the capture, so no call of the step is seen. The
    statistics would say "loss"; the batch may as well be the culprit, so the phase is
    "unknown", and the reason names the compile and what to do."""
    model = _build("sequential")
    watch, call = _watch_in_order("watch, then torch.compile", model)
    found = _steps_with_a_nan_batch(watch, call, model)
    watch.close()
    origin = found[-1].origin
    assert found[-1].nonfinite and origin.phase == "unknown", origin
    reason = origin.details["reason"]
    assert "torch.compile(model) made after the watch" in reason
    assert "gradscope.watch(torch.compile(model))" in reason and "locate=" in reason


@pytest.mark.parametrize("order", ORDERS)
def test_the_statistics_of_a_compiled_model_are_exact(order):
    """The watch's figures of a compiled step equal the gradients the compiled backward
    wrote (``aot_eager``: a compiled autograd graph)."""
    model = _build("net")
    watch, call = _watch_in_order(order, model, backend="aot_eager")
    for _ in range(3):
        model.zero_grad()
        call(torch.randn(8, 3)).square().mean().backward()
        stats = watch.collect()
    expected = [float(torch.linalg.vector_norm(p.grad.double())) for p in model.parameters()]
    watch.close()
    assert stats.param_grad_norm.tolist() == pytest.approx(expected, rel=1e-6)


class _StandInCudaGenerator:
    """CUDA's generators, as the capture sees them through gradscope.core.rng, on a CPU:
    every read notes whether dynamo was tracing it. (On CUDA, dynamo tracing into
    ``torch.cuda.get_rng_state_all()`` raised an AssertionError into the user's loop.)"""

    def __init__(self) -> None:
        self.reads: list[bool] = []

    def states(self) -> list[torch.Tensor]:
        self.reads.append(torch.compiler.is_compiling())
        return [torch.zeros(16, dtype=torch.uint8)]


@pytest.mark.parametrize(
    "order", [*ORDERS, "watch by module hooks, then model.compile()"], ids=lambda o: o
)
def test_dynamo_never_traces_the_capture(order, monkeypatch):
    """CPU reproduction of the CUDA failure: with a stand-in for CUDA's generator (CUDA
    "initialised"), the capture reads it at the compiled model's first forwards, and
    never while dynamo traces. Module hooks (where the capture takes the calls by hooks)
    are inlined into ``model.compile()``'s traced call: they break the graph there and run
    eagerly."""
    generator = _StandInCudaGenerator()
    monkeypatch.setattr(rng, "cuda_started", lambda: True)
    monkeypatch.setattr(replay_module, "cuda_started", lambda: True)
    monkeypatch.setattr(rng, "_cuda_states", generator.states)
    monkeypatch.setattr(rng, "_set_cuda_states", lambda states: None)
    model = _build("net")
    if order.startswith("watch by module hooks"):
        watch = gradscope.watch(model)
        watch.replay._to_hooks()
        model.compile(backend="eager")
        call = model
    else:
        watch, call = _watch_in_order(order, model)
    found = _steps_with_a_nan_batch(watch, call, model, steps=5)
    watch.close()
    assert generator.reads and not any(generator.reads), generator.reads
    assert found[-1].origin.phase == "input"


def test_every_function_a_compiled_call_reaches_is_kept_out_of_tracing():
    """What the capture puts on a model (the call slot's entry, the module hooks) and the
    capture's halves they call are marked for dynamo to leave alone."""
    model = _build("net")
    watch = gradscope.watch(model)
    entry = model.__dict__["_compiled_call_impl"]
    replay = watch.replay
    reached = [entry, replay._take, replay._before_forward, replay._finish, replay._after_forward]
    replay._to_hooks()
    reached += [h for h in model._forward_hooks.values()]
    model(torch.randn(2, 3))  # learning: the pre-hook is there too
    reached += [h for h in model._forward_pre_hooks.values()]
    watch.close()
    assert len(reached) == 7
    for function in reached:
        assert getattr(function, "_torchdynamo_disable", False), function


def test_a_dropped_compiled_watch_leaves_the_compiled_model_as_it_was():
    """``model.compile()`` then a watch: the capture's entry wraps the compiled call; a
    watch garbage collected without close() puts that call back."""
    model = _build("net")
    model.compile(backend="eager")
    compiled_call = model.__dict__["_compiled_call_impl"]
    watch = gradscope.watch(model)
    assert model.__dict__["_compiled_call_impl"] is not compiled_call
    model(torch.randn(2, 3)).sum().backward()
    watch.collect()
    gone = weakref.ref(watch.replay)
    del watch
    gc.collect()
    assert gone() is None
    assert model.__dict__["_compiled_call_impl"] is compiled_call


def test_a_nan_in_the_first_step_after_model_compile_names_the_compile():
    """``model.compile()`` after the watch replaces the capture's entry until the next
    collect(): a NaN batch in that very step cannot be named, and the reason says why."""
    model = _build("net")
    watch = gradscope.watch(model)
    for _ in range(2):
        model.zero_grad()
        model(torch.randn(4, 3)).square().mean().backward()
        watch.collect()
    model.compile(backend="eager")
    x = torch.randn(4, 3)
    x[0, 0] = float("nan")
    loss = model(x).square().mean()
    loss.backward()
    stats = watch.collect(loss)
    watch.close()
    assert stats.nonfinite and stats.origin.phase == "unknown", stats.origin
    assert "model.compile() made after the watch" in stats.origin.details["reason"]


@pytest.mark.parametrize("order", ORDERS)
def test_forward_statistics_of_a_compiled_model_cost_no_recompiles(order, recwarn):
    """Early warnings' forward hooks on a compiled model: dynamo traced their bookkeeping
    (a dict written per module) and recompiled at every new entry until its limit, then ran
    the model eagerly. The forward statistics are left out instead, with one warning; the
    compiled model compiles once or twice (the hooks there, then gone) and trains as it
    would unwatched; the gradients' statistics go on."""
    from torch._dynamo.utils import counters

    def train(call, model, watch=None):
        torch.manual_seed(1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses, frames = [], []
        for _ in range(12):
            loss = call(torch.randn(4, 3)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            if watch is not None:
                stats = watch.collect(loss)
                assert stats.grad_norm.shape == (2,) and stats.max_abs is not None
            optimizer.step()
            losses.append(loss.item())
            frames.append(counters["frames"]["total"])
        return losses, frames

    model = _build("net")
    unwatched, _ = train(torch.compile(model, backend="eager"), model)
    torch._dynamo.reset()
    counters.clear()
    model = _build("net")
    watch, call = _watch_in_order(order, model, early_warnings=True, detail_every=1)
    losses, frames = train(call, model, watch)
    watch.close()
    assert losses == unwatched
    assert frames[-1] <= 4 and frames[-1] == frames[2], frames  # nothing compiled after step 2
    told = [w for w in recwarn if "forward statistics" in str(w.message)]
    assert len(told) == 1 and "compiled" in str(told[0].message)
    assert watch.outputs.skipped == "the model is compiled (torch.compile)"
