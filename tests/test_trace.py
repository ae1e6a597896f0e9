"""Trace mode: event order on Sequential, a ResNet block with a skip connection and a reused
module; nothing hooked when off; rewind reproduces losses bit for bit."""

import json
from pathlib import Path

import torch
import torchvision
from torch import nn

from gradscope.cli import main
from gradscope.core.runner import StepRunner
from gradscope.core.sources import load_with_settings
from gradscope.core.trace import trace_step

REPO = Path(__file__).resolve().parents[1]


def _events(model, x):
    with trace_step(model) as trace:
        model(x).sum().backward()
    return trace.events


def test_sequential_backward_is_forward_reversed():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(3, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)
    )
    events = _events(model, torch.randn(4, 3))
    forward = [e.module for e in events if e.phase == "forward"]
    backward = [e.module for e in events if e.phase == "backward"]
    assert forward == ["0", "1", "2", "3", "4", ""]
    assert backward == list(reversed(forward))
    assert [e.order for e in events] == list(range(len(events)))
    linear = next(e for e in events if e.phase == "backward" and e.module == "4")
    expected = torch.linalg.vector_norm(model[4].weight.grad).item()
    assert abs(linear.param_norms["weight"] - expected) <= 1e-6 * expected
    assert linear.in_norm is not None and linear.out_norm > 0
    assert not any(m._forward_hooks for m in model.modules())


def test_resnet_block_with_skip_connection():
    torch.manual_seed(0)
    block = torchvision.models.resnet.BasicBlock(4, 4)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    events = _events(block, x)
    forward = [e.module for e in events if e.phase == "forward"]
    backward = [e.module for e in events if e.phase == "backward"]
    assert forward == ["conv1", "bn1", "relu", "conv2", "bn2", "relu", ""]
    # the block's own output gradient arrives first, then the residual branch backwards
    assert backward[0] == ""
    order = [backward.index(name) for name in ("bn2", "conv2", "bn1", "conv1")]
    assert order == sorted(order)
    # relu is called twice (after bn1 and after the addition): two forward events, and the
    # gradient through both calls is seen
    assert forward.count("relu") == 2 and backward.count("relu") == 2
    block_event = next(e for e in events if e.phase == "backward" and e.module == "")
    # the block's input gradient sums the branch and the skip connection
    assert abs(block_event.in_norm - torch.linalg.vector_norm(x.grad).item()) < 1e-4


def test_reused_module_gets_an_event_per_call():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Linear(4, 4)

        def forward(self, x):
            return self.block(torch.relu(self.block(x)))

    events = _events(Twice(), torch.randn(2, 4))
    assert [e.module for e in events if e.phase == "forward"] == ["block", "block", ""]
    assert [e.module for e in events if e.phase == "backward"] == ["", "block", "block"]


def test_nonfinite_events_are_flagged():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    with torch.no_grad():
        model[1].weight.fill_(float("inf"))
    events = _events(model, torch.randn(3, 2))
    flags = {(e.phase, e.module): e.nonfinite for e in events}
    assert flags[("forward", "0")] is False
    assert flags[("forward", "1")] is True


def test_trace_json_from_the_cli(capsys, tmp_path):
    report = tmp_path / "t.json"
    script = str(REPO / "sample_models" / "seed_explosion.py")
    assert main(["run", script, "--steps", "2", "--trace", "--json", str(report)]) == 0
    trace = json.loads(report.read_text())["trace"]
    assert {e["step"] for e in trace} == {0, 1}
    first = [e for e in trace if e["step"] == 0]
    assert [e["phase"] for e in first][:4] == ["forward"] * 4
    for key in ("step", "phase", "order", "module", "out_norm", "in_norm", "nonfinite"):
        assert key in first[0]


def test_trace_off_hooks_nothing():
    loaded, settings = load_with_settings(
        str(REPO / "sample_models" / "seed_explosion.py"), {"steps": 1}
    )
    runner = StepRunner(loaded, settings)
    seen = []
    original = nn.Module.register_forward_hook

    def spy(self, *args, **kwargs):
        seen.append(type(self).__name__)
        return original(self, *args, **kwargs)

    nn.Module.register_forward_hook = spy
    try:
        result = runner.step()
    finally:
        nn.Module.register_forward_hook = original
    assert result.trace is None and seen == []


def _run_losses(runner, steps):
    return [runner.step().loss for _ in range(steps)]


def test_rewind_reproduces_losses_bit_for_bit():
    source = str(REPO / "sample_models" / "seed_explosion.py")
    loaded, settings = load_with_settings(
        source, {"loss_scale": 1.0, "lr": 0.05, "optimizer": "adam", "rewind_depth": 5}
    )
    runner = StepRunner(loaded, settings)
    first = _run_losses(runner, 7)
    assert runner.rewind_steps == [2, 3, 4, 5, 6]
    assert runner.snapshot_bytes() > 0
    runner.rewind(4)
    assert runner.step_index == 4
    assert _run_losses(runner, 3) == first[4:7]
    # a what-if: a different learning rate from step 4 gives a different branch
    runner.rewind(4)
    runner.apply_settings(runner.settings.replaced(lr=0.5))
    branch = _run_losses(runner, 3)
    assert branch[0] == first[4] and branch[1:] != first[5:7]


def test_history_rewind_forgets_the_old_branch():
    from gradscope.core.history import RunHistory

    source = str(REPO / "sample_models" / "seed_explosion.py")
    loaded, settings = load_with_settings(source, {"rewind_depth": 3})
    runner = StepRunner(loaded, settings)
    history = RunHistory()
    names = [layer.name for layer in runner.watch.layers]
    for _ in range(5):
        result = runner.step()
        history.append(result.step, result.loss, result.stats, names)
    assert len(history.events) == 2  # both layers exploding from step 0
    runner.rewind(3)
    history.rewind_to(3)
    assert list(history.steps) == [0, 1, 2]
    runner.apply_settings(runner.settings.replaced(loss_scale=1.0))
    result = runner.step()
    history.append(result.step, result.loss, result.stats, names)
    assert list(history.steps) == [0, 1, 2, 3]
    assert history.worst(names[0]) == "exploding"  # from the steps that remain
    history.rewind_to(0)
    # No step left: each layer's worst status is back to the lowest one, which any step's
    # status replaces.
    assert history.count == 0 and history.events == [] and history.worst(names[0]) == "frozen"
