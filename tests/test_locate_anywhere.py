"""Locating a NaN/Inf with nothing from the user: ``collect(loss)`` without ``locate=``
repeats the captured step (gradscope.core.replay) and names the module, the operation and
the line; the repeat is invisible to the run (weights, buffers, gradients of every model
the loss goes through, every random generator)."""

import random

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.core.watch import GradientWatch


def _line_of(text: str) -> int:
    """The line of this file that holds ``text`` (once)."""
    with open(__file__) as handle:
        found = [n for n, line in enumerate(handle, start=1) if line.rstrip().endswith(text)]
    assert len(found) == 1, found
    return found[0]


class LogOfZero(nn.Module):
    def forward(self, x):
        return torch.log(x.relu() * 0.0)  # forward log(0) marker


class LogModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.head = nn.Sequential(nn.Linear(4, 4), LogOfZero())
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.inner(x)
        return self.head(h) if self.calls >= 3 else h


class PairDistance(nn.Module):
    """No parameters: sqrt of squared distances, NaN in backward where two rows are equal."""

    def forward(self, points):
        difference = points[:, None, :] - points[None, :, :]
        return (difference * difference).sum(-1).sqrt()  # backward sqrt(0) marker


class DistanceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 3)
        self.distance = PairDistance()

    def forward(self, x):
        return self.distance(self.embed(x))


class HFStyle(nn.Module):
    """Computes its loss in forward and returns a dict, as transformers models do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x, labels=None):
        logits = self.body(x) * self.scale
        loss = None
        if labels is not None:
            loss = (logits - labels).square().mean() / labels.abs().sum()  # in-model loss marker
        return {"loss": loss, "logits": logits}


def _train(model, make_batch, loss_of, steps=4, **options):
    """An own loop: forward, loss, backward, collect(loss) with no locate=, step."""
    torch.manual_seed(0)
    watch = gradscope.watch(model, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    origin = None
    for step in range(steps):
        optimizer.zero_grad()
        batch = make_batch(step)
        loss = loss_of(model, batch)
        loss.backward()
        stats = watch.collect(loss)
        if stats.origin is not None:
            origin = stats.origin
            break
        optimizer.step()
    watch.close()
    return origin


def test_forward_log_of_zero_in_a_submodule():
    origin = _train(
        LogModel(),
        lambda step: torch.randn(2, 4),
        lambda model, x: model(x).sum(),
    )
    assert origin is not None
    assert (origin.phase, origin.module, origin.op) == ("forward", "head.1", "torch.log")
    assert origin.file == __file__
    assert origin.line == _line_of("# forward log(0) marker")
    assert origin.details.get("repeated") == "captured step"


class OnlyThirdCall(LogModel):
    """NaN on its third call only: a repeat of that step is call 4, and finite."""

    def forward(self, x):
        self.calls += 1
        h = self.inner(x)
        return self.head(h) if self.calls == 3 else h


def _calls_after_the_nan_step(model):
    watch = gradscope.watch(model)
    origin = None
    for _ in range(4):
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        origin = watch.collect(loss).origin
        model.zero_grad()
        if origin is not None:
            break
    watch.close()
    return origin, model.calls


def test_the_repeat_puts_back_python_state_it_changed():
    """The re-run is one more call of forward: a counter the forward keeps is put back."""
    torch.manual_seed(0)
    origin, calls = _calls_after_the_nan_step(LogModel())
    assert origin is not None and origin.phase == "forward"
    assert calls == 3  # the user's three forwards; the repeat's fourth is not counted


def test_a_repeat_that_takes_another_path_names_the_state_it_changed():
    torch.manual_seed(0)
    origin, calls = _calls_after_the_nan_step(OnlyThirdCall())
    assert origin is not None and origin.phase == "unknown"
    reason = origin.details["reason"]
    assert "repeat of this step's forward and backward was finite" in reason
    assert "changes Python state on the model (calls 3 -> 4; put back after the re-run)" in reason
    assert calls == 3


def test_backward_sqrt_of_zero_in_a_parameter_free_module():
    def batch(step):
        x = torch.randn(3, 3)
        if step == 2:
            x[1] = x[0]  # two equal rows: distance 0
        return x

    origin = _train(DistanceModel(), batch, lambda model, x: model(x).sum())
    assert origin is not None
    assert origin.phase == "backward"
    assert origin.module == "distance"
    assert origin.op.startswith("Tensor.sqrt backward")
    assert (origin.file, origin.line) == (__file__, _line_of("# backward sqrt(0) marker"))


def test_loss_computed_inside_the_model_returning_a_dict():
    def batch(step):
        labels = torch.zeros(2, 4) if step == 2 else torch.randn(2, 4)
        return torch.randn(2, 4), labels

    origin = _train(HFStyle(), batch, lambda model, b: model(b[0], labels=b[1])["loss"])
    assert origin is not None
    assert (origin.phase, origin.module) == ("forward", "")
    assert origin.op == "Tensor.__truediv__" or "div" in origin.op
    assert (origin.file, origin.line) == (__file__, _line_of("# in-model loss marker"))


def test_locate_given_still_wins():
    model = LogModel()
    watch = gradscope.watch(model)
    seen = []
    x = torch.randn(2, 4)
    for _ in range(3):
        model.zero_grad()
        loss = model(x).sum()
        loss.backward()

        def locate():
            seen.append(True)
            return model(x).sum()

        stats = watch.collect(loss, locate=locate)
    watch.close()
    assert seen  # the user's function ran, not the capture
    assert "repeated" not in stats.origin.details
    assert stats.origin.module == "head.1"


def test_without_the_capture_the_statistics_stand():
    origin = _train(
        LogModel(), lambda step: torch.randn(2, 4), lambda m, x: m(x).sum(), replay=False
    )
    assert origin.module is None and origin.line is None


def test_an_output_gradient_over_the_bound_is_said_once_and_named():
    with pytest.warns(UserWarning, match="max_gradient_bytes") as caught:
        origin = _train(
            DistanceModel(),
            lambda step: torch.randn(3, 3) if step != 2 else torch.ones(3, 3),
            lambda model, x: model(x).sum(),
            max_gradient_bytes=8,
        )
    assert len([w for w in caught if "max_gradient_bytes" in str(w.message)]) == 1
    assert origin.module is None or origin.line is None
    assert "max_gradient_bytes" in origin.details["reason"]


# -- invisibility -------------------------------------------------------------------------
class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.norm = nn.BatchNorm1d(4)
        self.poisoned = False

    def forward(self, z):
        noise = random.random() + float(np.random.rand())  # Python and numpy draws
        out = self.norm(self.drop(self.layer(z))) * noise
        # sqrt(0): finite forward, Inf in backward, after the discriminator's gradients
        return torch.sqrt(out * 0.0) if self.poisoned else out


@pytest.mark.parametrize("locate", [False, True], ids=["captured", "locate_given"])
def test_the_repeat_is_invisible(locate):
    """An unwatched discriminator's gradients, the generator's buffers and gradients, and
    the torch, Python and numpy random streams are as if no repeat had happened."""
    torch.manual_seed(0)
    generator, discriminator = Generator(), nn.Linear(4, 1)
    watch = GradientWatch(generator)
    z = torch.randn(8, 4)

    def compute_loss():
        return discriminator(generator(z)).mean()

    for poisoned in (False, True):
        generator.poisoned = poisoned
        random.seed(5)
        np.random.seed(5)
        torch.manual_seed(5)
        for p in [*generator.parameters(), *discriminator.parameters()]:
            p.grad = None
        loss = compute_loss()
        loss.backward()
        d_grads = [p.grad.clone() for p in discriminator.parameters()]
        g_grads = [p.grad.clone() for p in generator.parameters()]
        buffers = [b.clone() for b in generator.buffers()]
        streams = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        stats = watch.collect(loss, locate=compute_loss if locate else None)
    watch.close()
    assert stats.origin.phase == "backward" and stats.origin.module == ""
    assert stats.origin.op.startswith("torch.sqrt backward")
    for before, p in zip(d_grads, discriminator.parameters(), strict=True):
        assert torch.equal(before, p.grad)
    for before, p in zip(g_grads, generator.parameters(), strict=True):
        assert torch.equal(torch.nan_to_num(before), torch.nan_to_num(p.grad))
    for before, b in zip(buffers, generator.buffers(), strict=True):
        assert torch.equal(before, b)
    assert random.getstate() == streams[0]
    assert np.array_equal(np.random.get_state()[1], streams[1])
    assert torch.equal(torch.get_rng_state(), streams[2])


RANDOM_SCRIPT = """
import random

import numpy as np
import torch
from torch import nn

CONFIG = {"steps": 4, "batch_size": 4, "lr": 0.1, "rewind_depth": 5}


class Noisy(nn.Module):
    def forward(self, x):
        # draws from Python's and numpy's generators, as augmentation code in forward does
        return x * (1.0 + random.random() + float(np.random.rand()))


def build_model():
    return nn.Sequential(nn.Linear(3, 5), Noisy(), nn.Linear(5, 1))


def make_batch(batch_size, device):
    torch.manual_seed(0)
    return torch.randn(batch_size, 3, device=device), torch.randn(batch_size, 1, device=device)
"""


def test_a_rewind_brings_back_python_and_numpy_streams(write_script):
    from gradscope.core.runner import StepRunner
    from gradscope.core.sources import load_with_settings

    loaded, settings = load_with_settings(str(write_script(RANDOM_SCRIPT, "noisy.py")), {})
    runner = StepRunner(loaded, settings)
    first = [runner.step().loss for _ in range(3)]
    runner.rewind(1)
    again = [runner.step().loss for _ in range(2)]
    runner.close()
    assert again == first[1:]


# -- the failing step's trace, recorded with its origin ------------------------------------
def _report_json(recording, tmp_path):
    import json

    from gradscope.cli import main

    out = tmp_path / "report.json"
    assert main(["report", str(recording), "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _assert_trace_leads_to(origin: dict):
    trace = origin["trace"]
    assert {e["phase"] for e in trace} <= {"forward", "backward"}
    assert [e["order"] for e in trace] == sorted(e["order"] for e in trace)
    first = next(e for e in trace if e["nonfinite"] > 0)
    module = origin["module"]
    assert first["module"] == module or (module == "" or first["module"].startswith(module + "."))
    assert first["phase"] == ("forward" if origin["phase"] in ("forward", "loss") else "backward")
    for key in ("shape", "dtype", "nan", "inf"):
        assert key in first
    assert first["nan"] + first["inf"] == first["nonfinite"]


@pytest.mark.parametrize("case", ["forward_log", "backward_sqrt", "loss_in_model"])
def test_report_json_has_the_failing_steps_trace(tmp_path, case, capsys):
    recording = tmp_path / f"{case}.gsrec"
    if case == "forward_log":
        origin = _train(
            LogModel(), lambda s: torch.randn(2, 4), lambda m, x: m(x).sum(), record=recording
        )
    elif case == "backward_sqrt":

        def batch(step):
            x = torch.randn(3, 3)
            if step == 2:
                x[1] = x[0]
            return x

        origin = _train(DistanceModel(), batch, lambda m, x: m(x).sum(), record=recording)
    else:

        def batch(step):
            return torch.randn(2, 4), torch.zeros(2, 4) if step == 2 else torch.randn(2, 4)

        origin = _train(
            HFStyle(), batch, lambda m, b: m(b[0], labels=b[1])["loss"], record=recording
        )
    report = _report_json(recording, tmp_path)
    capsys.readouterr()
    first = report["first_nonfinite"]
    assert (first["module"], first["line"]) == (origin.module, origin.line)
    _assert_trace_leads_to(first)
    assert report["nonfinite_origins"] and all("trace" in o for o in report["nonfinite_origins"])
    # the forward events name every module the step ran, in the order their calls finished
    forward = [e["module"] for e in first["trace"] if e["phase"] == "forward"]
    assert forward[-1] == ""
    if case == "backward_sqrt":
        assert forward == ["embed", "distance", ""]
        backward = [e for e in first["trace"] if e["phase"] == "backward"]
        assert backward[0]["module"] == "" and backward[0]["nonfinite"] == 0


SQRT_SCRIPT = """
import torch
from torch import nn

CONFIG = {"steps": 3, "batch_size": 4, "lr": 0.01}


class Distance(nn.Module):
    def forward(self, x):
        return (x * x).sum(-1, keepdim=True).mul(0.0).sqrt()


def build_model():
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU(), Distance(), nn.Linear(1, 1))


def make_batch(batch_size, device):
    return -torch.ones(batch_size, 3, device=device), torch.zeros(batch_size, 1, device=device)
"""


def test_gradscope_run_and_an_own_loop_without_locate_give_the_same_origin(
    tmp_path, write_script, capsys
):
    """``gradscope run`` re-runs with its own locate=; the own loop repeats the captured
    step: the same phase, module, operation and line."""
    import json

    from gradscope.cli import main

    script = write_script(SQRT_SCRIPT, "distance.py")
    out = tmp_path / "run.json"
    main(["run", str(script), "--json", str(out)])
    capsys.readouterr()
    run = json.loads(out.read_text())["first_nonfinite"]

    namespace: dict = {}
    exec(compile(SQRT_SCRIPT, str(script), "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["build_model"]()
    x, y = namespace["make_batch"](4, "cpu")
    with gradscope.watch(model) as watch:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        origin = watch.collect(loss).origin
    assert run["phase"] == "backward" and run["module"] == "2"
    assert (origin.phase, origin.module, origin.op, origin.file, origin.line) == (
        run["phase"],
        run["module"],
        run["op"],
        run["file"],
        run["line"],
    )


class Noise(nn.Module):
    def forward(self, x):
        return x * (1.0 + random.random() + float(np.random.rand()))


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def forward(self, x):
        return torch.log(x * 0.0) if self.broken else x


def test_the_repeat_draws_the_steps_own_random_numbers():
    """Dropout masks (torch's CPU generator) and Python/numpy draws in forward are the
    failing step's own in the repeat: its trace shows the values the step computed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), Noise(), Gate())
    seen: dict[str, list[float]] = {"1": [], "2": []}
    for name in seen:
        model.get_submodule(name).register_forward_hook(
            lambda m, a, out, name=name: seen[name].append(float(out.mean()))
        )
    watch = gradscope.watch(model)
    x = torch.randn(8, 4)
    for step in range(5):  # the first forwards show which generators forward draws from
        model[3].broken = step == 4
        model.zero_grad()
        loss = model(x).sum()
        loss.backward()
        kept = {name: values[-1] for name, values in seen.items()}
        stats = watch.collect(loss)
    watch.close()
    assert stats.origin.module == "3"
    trace = stats.origin.details["trace"]
    means = {e["module"]: e.get("mean") for e in trace if e["phase"] == "forward"}
    for name in ("1", "2"):
        assert means[name] == pytest.approx(kept[name], rel=1e-6)


class RowRoot(nn.Module):
    def forward(self, x):
        return x.abs().sum(-1).sqrt()  # row root marker


def test_gradient_accumulation_repeats_each_micro_batch_in_turn():
    """Three micro-batches summed into one optimizer step; the NaN comes from the first:
    each kept forward is repeated in order and the first one located wins."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    watch = gradscope.watch(model)
    for step in range(2):
        model.zero_grad()
        for micro in range(3):
            x = torch.randn(3, 3)
            if step == 1 and micro == 0:
                x = torch.zeros(3, 3)  # zero rows in the first micro-batch only
                model[0].bias.data.zero_()
            (model(x).sum() / 3).backward()
        stats = watch.collect()
    watch.close()
    origin = stats.origin
    assert origin.phase == "backward" and origin.module == "1"
    assert origin.details["forward_call"] == 0
    assert (origin.file, origin.line) == (__file__, _line_of("# row root marker"))


def test_micro_batches_past_the_bound_are_named_and_counted_per_step():
    """More micro-batches than the capture keeps (MAX_CALLS_PER_STEP): a NaN from a dropped
    one is not located, and the reason says how many were not kept; the count is the step's
    own (the next step starts again from none)."""
    from gradscope.core.replay import MAX_CALLS_PER_STEP

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    watch = gradscope.watch(model)
    extra = 3
    for step in range(3):
        model.zero_grad()
        micro_batches = MAX_CALLS_PER_STEP + extra if step == 1 else 2
        for micro in range(micro_batches):
            x = torch.randn(3, 3) + 2.0
            if step == 1 and micro == 0:
                x = torch.zeros(3, 3)  # zero rows in the first micro-batch, which is dropped
                model[0].bias.data.zero_()
            (model(x).sum() / micro_batches).backward()
        if step == 1:
            assert watch.replay.dropped_calls == extra
        stats = watch.collect()
        assert watch.replay.dropped_calls == 0
        if step == 1:
            found = stats
            with torch.no_grad():
                model[0].bias.normal_()
    watch.close()
    assert found.nonfinite and found.origin.op is None
    assert f"first {extra} forward call(s) were not kept" in found.origin.details["reason"]


def _row_root_nan_at(model, watch, steps: int, call=None, mid_step=None, after_step=None):
    """``steps`` steps of ``call`` (default: the model) on random rows; the last one's rows
    are zero (sqrt(0) in backward). ``mid_step()`` runs after each forward, before its
    backward; ``after_step(step)`` after each collect()."""
    call = call or model
    found = []
    for step in range(steps):
        model.zero_grad()
        x = torch.randn(4, 3)
        if step == steps - 1:
            x = torch.zeros(4, 3)
            model[0].bias.data.zero_()
        loss = call(x).sum()
        if mid_step is not None:
            mid_step()
        loss.backward()
        found.append(watch.collect(loss))
        if after_step is not None:
            after_step(step)
    return found


def _row_root_steps(steps: int, *, copy_mid_step: bool = False, by_hooks: bool = False):
    """Linear then RowRoot; the last step's rows are all zero: sqrt(0) in backward.
    ``by_hooks``: module hooks take the calls instead of the model's call slot."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    watch = gradscope.watch(model)
    if by_hooks:
        watch.replay._to_hooks()

    def copy_the_model() -> None:  # after the forward, before collect(): an EMA or reference
        twin = copy.deepcopy(model)
        twin(torch.randn(4, 3)).sum().backward()
        assert twin[0].weight.grad is not None

    def check_the_capture(step: int) -> None:
        if step >= 3:  # the first forwards showed that the forward's end alone will do
            assert not model._forward_pre_hooks
            if by_hooks:
                assert len(model._forward_hooks) == 1
            else:  # no module hook at all: the capture is in the model's call slot
                assert not model._forward_hooks and watch.replay.mode == "call"
                assert model.__dict__["_compiled_call_impl"] is not None

    found = _row_root_nan_at(
        model,
        watch,
        steps,
        mid_step=copy_the_model if copy_mid_step else None,
        after_step=check_the_capture,
    )
    watch.close()
    assert not model._forward_hooks  # close() removed what was left
    assert "_compiled_call_impl" not in model.__dict__
    return found


@pytest.mark.parametrize("by_hooks", [False, True], ids=["call_slot", "module_hooks"])
def test_after_the_first_forwards_the_calls_end_captures_and_still_locates(by_hooks):
    """A forward that draws from no generator and writes no buffer needs nothing taken
    before it: after the first forwards only the call's end is taken (in the model's call
    slot, or by one forward hook), and a backward NaN many steps later is still located at
    its operation and line."""
    found = _row_root_steps(8, by_hooks=by_hooks)
    assert not any(s.nonfinite for s in found[:-1])
    origin = found[-1].origin
    assert origin.phase == "backward" and origin.module == "1"
    assert (origin.file, origin.line) == (__file__, _line_of("# row root marker"))


@pytest.mark.parametrize("by_hooks", [False, True], ids=["call_slot", "module_hooks"])
def test_a_copy_of_the_watched_model_mid_step_works_and_the_watch_goes_on(by_hooks):
    """copy.deepcopy of a watched model mid-step: the copy has no call slot of the capture
    (``nn.Module.__getstate__`` leaves it out), and module hooks copied with it do nothing
    there; the watch goes on locating."""
    found = _row_root_steps(6, copy_mid_step=True, by_hooks=by_hooks)
    origin = found[-1].origin
    assert origin.phase == "backward" and origin.module == "1"
    assert (origin.file, origin.line) == (__file__, _line_of("# row root marker"))


def test_a_compile_made_after_the_watch_is_not_captured_and_the_origin_says_so():
    """``torch.compile(model)`` made after the watch traces the module's call path itself,
    past the call slot: its steps are not captured (as a compiled model's are not), nothing
    breaks, and the NaN step's origin comes from the statistics with a reason that names
    the compile and locate=."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    watch = gradscope.watch(model)
    assert watch.replay.mode == "call"
    compiled = torch.compile(model, backend="eager")
    found = _row_root_nan_at(model, watch, 4, call=compiled)
    watch.close()
    torch._dynamo.reset()
    assert not any(s.nonfinite for s in found[:-1])
    origin = found[-1].origin
    assert found[-1].nonfinite and origin.op is None
    assert "torch.compile" in origin.details["reason"]
    assert "locate=" in origin.details["reason"]


def test_the_call_slot_held_by_a_compile_or_an_earlier_capture():
    """``model.compile()`` after the watch fills the call slot with its own compiled call:
    the capture's entry goes back in front of it at the next collect(), and a later NaN is
    still located. A second watch of the model takes the slot over from the first (which
    was not closed), and says so. A model compiled in place before the watch is captured
    too, its compiled call wrapped (tests/test_compile.py has the orders with a NaN batch)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    first = gradscope.watch(model)
    with pytest.warns(UserWarning, match="takes over the capture of an earlier"):
        second = gradscope.watch(model)
    assert (first.replay.mode, second.replay.mode) == (None, "call")
    assert "took over" in first.replay.failed
    second.close()
    assert "_compiled_call_impl" not in model.__dict__
    third = gradscope.watch(model)
    model.compile(backend="eager")
    compiled_call = model.__dict__["_compiled_call_impl"]
    found = _row_root_nan_at(model, third, 6)
    assert third.replay.mode == "call" and third.replay._call_impl is compiled_call
    origin = found[-1].origin
    assert origin.phase == "backward" and origin.module == "1", origin
    third.close()
    assert model.__dict__["_compiled_call_impl"] is compiled_call  # the compile's, kept
    assert gradscope.watch(model).replay.mode == "call"  # compiled in place before the watch
    torch._dynamo.reset()


def test_a_watched_model_pickles_without_the_capture():
    """``torch.save`` / pickle of a model the capture holds: the copy carries no call slot
    (``nn.Module.__getstate__`` leaves it out) and loads and runs where GradScope's watch
    does not exist."""
    import io
    import pickle

    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    watch = gradscope.watch(model)
    model(torch.randn(2, 3)).sum().backward()
    copy_ = pickle.loads(pickle.dumps(model))
    assert "_compiled_call_impl" not in copy_.__dict__
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert "_compiled_call_impl" not in loaded.__dict__
    assert loaded(torch.randn(2, 3)).shape == (2,)
    watch.close()


def test_the_output_gradient_goes_at_collect_and_the_users_own_stays():
    """The gradient at the model's output is kept by autograd (``retain_grad``: no Python
    call in the backward) until collect(): after it, the output holds no gradient (issue
    #34: a language model's is batch x sequence x vocabulary). An output the user asked a
    gradient of inside the forward (before the capture saw it) keeps its own; an output the
    user lets go of takes its gradient with it (a weak reference: nothing kept alive)."""
    import gc
    import weakref

    class KeepsItsOutputGradient(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
            self.keep = False

        def forward(self, x):
            out = self.layers(x)
            if self.keep:
                out.retain_grad()  # the user's own, inside the forward
            return out

    torch.manual_seed(0)
    model = KeepsItsOutputGradient()
    watch = gradscope.watch(model)
    for step in range(6):
        model.zero_grad()
        model.keep = step == 4
        out = model(torch.randn(5, 4))
        loss = out.square().sum()
        loss.backward()
        assert out.grad is not None and torch.equal(out.grad, 2 * out.detach())
        watch.collect(loss)
        if step == 4:
            assert torch.equal(out.grad, 2 * out.detach())
        else:
            assert out.grad is None
    # an output the user lets go of is not kept alive by the capture
    gone = weakref.ref(out)
    del out, loss
    gc.collect()
    assert gone() is None
    watch.close()
