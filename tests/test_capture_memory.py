"""What the per-step capture (gradscope.core.replay) holds, and for how long (issue #34):
no graph of a forward that never reached backward, nothing of a watch that was replaced or
dropped, no output gradient after collect(); and the buffers a forward writes are put back
before the repeat."""

import gc
import weakref

import pytest
import torch
from torch import nn

import gradscope


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _train_step(model, watch):
    model.zero_grad()
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    return watch.collect(loss)


@pytest.mark.parametrize("case", ["skipped batch", "caught out-of-memory", "validation"])
def test_no_graph_is_kept_of_a_forward_that_never_reached_backward(case):
    """Twelve training-mode forwards with gradients on whose backward never runs: a batch
    skipped for a non-finite loss, an out-of-memory error the loop catches, a validation
    pass left in train mode. Each output (and with it the graph behind it) dies once the
    user lets it go, the latest at the next forward at the latest; the step then trains
    and collects as usual. Before, the capture kept up to 16 of them alive (468 MiB in the
    issue's measurement)."""
    model = _mlp()
    watch = gradscope.watch(model)
    _train_step(model, watch)
    outputs = []
    for _ in range(12):
        out = model(torch.randn(4, 8))
        outputs.append(weakref.ref(out))
        if case == "skipped batch":
            loss = out.square().mean() * float("nan")
            if not torch.isfinite(loss):
                del loss, out
                continue
        elif case == "caught out-of-memory":
            try:
                raise torch.OutOfMemoryError("CUDA out of memory (stand-in)")
            except torch.OutOfMemoryError:
                del out
                continue
        del out
    gc.collect()
    assert [ref() is None for ref in outputs[:-1]] == [True] * 11
    seen = []  # the last one is let go before the next forward runs, not after it
    model[0].register_forward_pre_hook(lambda *_: seen.append(outputs[-1]() is None))
    stats = _train_step(model, watch)
    assert seen == [True]
    gc.collect()
    assert all(ref() is None for ref in outputs)
    assert not stats.nonfinite
    watch.close()


@pytest.mark.parametrize("held", [True, False], ids=["outputs held", "outputs not held"])
def test_a_forward_whose_backward_comes_later_is_still_repeated(held):
    """Two forwards, one loss (a siamese pair): the capture lets go of the first call's
    output once the second forward comes, and its gradient still arrives (a hook in the
    graph), whether or not the user holds the outputs: a NaN in the backward of the first
    call is located there."""

    class RowRoot(nn.Module):
        def forward(self, x):
            return x.abs().sum(-1).sqrt()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    watch = gradscope.watch(model)
    for step in range(4):
        model.zero_grad()
        a, b = torch.randn(4, 3), torch.randn(4, 3)
        if step == 3:
            a = torch.zeros(4, 3)
            model[0].bias.data.zero_()
        if held:
            first, second = model(a), model(b)
            loss = first.sum() + second.sum()
        else:
            loss = model(a).sum() + model(b).sum()
        loss.backward()
        stats = watch.collect(loss)
    watch.close()
    assert stats.nonfinite
    assert (stats.origin.phase, stats.origin.module) == ("backward", "1"), stats.origin
    assert stats.origin.details.get("forward_call") == 0


def test_a_new_watch_takes_over_and_a_dropped_one_leaves_nothing():
    """One watch per epoch, none closed (a notebook cell run again): each new watch takes
    the capture over from the last, which says so once; every forward passes through one
    capture only, and an old watch keeps no batch. A watch garbage collected leaves nothing
    on the model: no call slot, no hook."""
    model = _mlp()
    replays = []
    for epoch in range(3):
        if epoch:
            with pytest.warns(UserWarning, match="takes over the capture"):
                watch = gradscope.watch(model)
        else:
            watch = gradscope.watch(model)
        replays.append(watch.replay)
        for _ in range(4):
            _train_step(model, watch)
        model(torch.randn(4, 8))  # a forward left uncollected
        for old in replays[:-1]:
            assert old.mode is None and not old.calls
        assert watch.replay.calls
    entry = model.__dict__["_compiled_call_impl"]
    assert entry.gradscope_replay() is replays[-1]
    assert not model._forward_hooks and not model._forward_pre_hooks
    gone = [weakref.ref(r) for r in replays]
    del watch, replays, entry, old
    gc.collect()
    assert all(ref() is None for ref in gone)
    assert "_compiled_call_impl" not in model.__dict__
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_a_dropped_watch_by_module_hooks_leaves_nothing():
    model = _mlp()
    watch = gradscope.watch(model)
    watch.replay._to_hooks()
    _train_step(model, watch)
    assert model._forward_hooks
    gone = weakref.ref(watch.replay)
    del watch
    gc.collect()
    assert gone() is None
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_no_output_gradient_is_held_after_collect():
    """After collect() of a finite step, the output's gradient the capture asked autograd
    to keep is gone (a language model's is batch x sequence x vocabulary)."""
    model = _mlp()
    watch = gradscope.watch(model)
    for _ in range(4):
        model.zero_grad()
        out = model(torch.randn(4, 8))
        loss = out.square().mean()
        loss.backward()
        gradient = weakref.ref(out.grad)
        watch.collect(loss)
        gc.collect()
        assert out.grad is None and gradient() is None
    watch.close()


class ScaledByItsCount(nn.Module):
    """A forward that reads a buffer it writes: the output is divided by (3 - the number of
    earlier forwards), so the fourth forward divides by zero."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        out = x / (3.0 - self.count)  # division by the count marker
        self.count += 1.0
        return out


def test_the_buffers_a_forward_writes_are_put_back_before_the_repeat():
    """The repeat of the fourth step's forward reads the buffer as that forward did (count
    3: x / 0); without the capture's copy put back, it would read 4, stay finite and name
    nothing. After the repeat the buffer is where training left it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), ScaledByItsCount())
    watch = gradscope.watch(model)
    for _ in range(4):
        model.zero_grad()
        loss = model(torch.randn(4, 3)).sum()
        loss.backward()
        stats = watch.collect(loss)
    watch.close()
    origin = stats.origin
    assert stats.nonfinite and (origin.phase, origin.module) == ("forward", "1"), origin
    with open(__file__) as handle:
        marker = [n for n, line in enumerate(handle, 1) if "division by the count marker" in line]
    assert (origin.file, origin.line) == (__file__, marker[0])
    assert float(model[1].count) == 4.0
