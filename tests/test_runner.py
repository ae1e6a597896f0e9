"""The step runner on real models: the seed scenario, halting at NaN, bit-identical training
with and without the watch, torchvision models, settings changed between steps."""

import math
from pathlib import Path

import torch

from gradscope.core.history import RunHistory
from gradscope.core.runner import StepRunner
from gradscope.core.settings import RunSettings
from gradscope.core.sources import load_with_settings
from gradscope.core.watch import STATUS_EXPLODING, STATUS_OK

REPO = Path(__file__).resolve().parents[1]

SEED_SCRIPT = str(REPO / "sample_models" / "seed_explosion.py")

NAN_SCRIPT = """
import torch
from torch import nn


CONFIG = {"steps": 6, "batch_size": 4, "lr": 0.1}

class Blowup(nn.Module):
    def __init__(self):
        super().__init__()
        self.steps = 0
    def forward(self, x):
        self.steps += 1
        # finite for two calls, then the module's own code divides by zero
        return x / (0.0 if self.steps >= 3 else 1.0)

def build_model():
    return nn.Sequential(nn.Linear(3, 5), Blowup(), nn.Linear(5, 1))

def make_batch(batch_size, device):
    return torch.randn(batch_size, 3, device=device), torch.randn(batch_size, 1, device=device)
"""


def _losses(source, watch=True, **overrides):
    loaded, settings = load_with_settings(source, overrides)
    runner = StepRunner(loaded, settings, watch=watch)
    return [r.loss for r in runner.run()], runner


def test_seed_scenario_reports_critical_layer_exploding():
    loaded, settings = load_with_settings(SEED_SCRIPT, {"steps": 3})
    runner = StepRunner(loaded, settings)
    names = [layer.name for layer in runner.watch.layers]
    assert names == ["critical_layer", "output_layer"]
    result = runner.step()
    critical = names.index("critical_layer")
    weight_norm = torch.linalg.vector_norm(runner.model.critical_layer.weight.grad).item()
    assert weight_norm > 1000
    assert result.stats.status[critical] == STATUS_EXPLODING
    assert result.stats.grad_norm[critical] > 1000
    assert result.origin is None and result.applied


def test_same_model_without_loss_scale_is_ok():
    loaded, settings = load_with_settings(SEED_SCRIPT, {"steps": 2, "loss_scale": 1.0})
    runner = StepRunner(loaded, settings)
    result = runner.step()
    assert (result.stats.status == STATUS_OK).all()


def test_watching_never_changes_training_bit_for_bit():
    overrides = {"steps": 5, "loss_scale": 1.0, "lr": 0.05, "optimizer": "adam"}
    plain, _ = _losses(SEED_SCRIPT, watch=False, **overrides)
    watched, _ = _losses(SEED_SCRIPT, watch=True, update_ratio=True, **overrides)
    assert plain == watched
    assert len(set(plain)) > 1  # training really moved


def test_nan_step_halts_before_the_optimizer_step(write_script):
    path = write_script(NAN_SCRIPT)
    loaded, settings = load_with_settings(str(path), {})
    runner = StepRunner(loaded, settings)
    results = list(runner.run())
    assert len(results) == 3 and runner.halted
    last = results[-1]
    assert not last.applied and last.nonfinite
    origin = runner.first_nonfinite
    assert (origin.step, origin.phase, origin.module, origin.tensor) == (
        2,
        "forward",
        "1",
        "output",
    )
    assert origin.file == str(path) and "x / (0.0" in origin.code
    # the weights are those before the failing step: still finite
    assert all(torch.isfinite(p).all() for p in runner.model.parameters())


def test_keep_going_runs_every_step(write_script):
    path = write_script(NAN_SCRIPT)
    losses, runner = _losses(str(path), keep_going=True)
    assert len(losses) == 6 and not runner.halted
    assert runner.first_nonfinite.step == 2
    assert all(math.isfinite(v) for v in losses[:2])


def test_torchvision_resnet_watched_on_every_module():
    loaded, settings = load_with_settings(
        "resnet18", {"steps": 1, "batch_size": 2, "image_size": 64}
    )
    settings = settings.replaced(layers=["*"])
    runner = StepRunner(loaded, settings)
    # every module with parameters somewhere below it (ReLU and pooling have none to watch)
    expected = [n for n, m in runner.model.named_modules() if any(True for _ in m.parameters())]
    assert [layer.name for layer in runner.watch.layers] == expected
    (result,) = list(runner.run())
    assert math.isfinite(result.loss)
    assert result.stats.grad_norm.shape == (len(runner.watch.layers),)
    history = RunHistory()
    history.append(result.step, result.loss, result.stats, [la.name for la in runner.watch.layers])
    assert history.count == 1


def test_vit_gets_its_fixed_input_size():
    loaded, settings = load_with_settings("vit_b_16", {"image_size": 64})
    assert settings.image_size == 224 and loaded.notes


def test_settings_change_between_steps_applies_next_step():
    loaded, settings = load_with_settings(SEED_SCRIPT, {"steps": 3})
    runner = StepRunner(loaded, settings)
    runner.step()
    runner.apply_settings(runner.settings.replaced(lr=0.5, clip=1.0, loss_scale=1.0))
    assert runner.optimizer.param_groups[0]["lr"] == 0.5
    result = runner.step()
    assert result.loss < 1e6  # loss scale no longer applied
    runner.apply_settings(runner.settings.replaced(layers=["output_layer"]))
    result = runner.step()
    assert [layer.name for layer in runner.watch.layers] == ["output_layer"]
    assert result.stats.grad_norm.shape == (1,)


def test_default_settings_validate():
    assert RunSettings().validated().device == "auto"


def test_many_layers_turning_bad_together_make_one_event():
    import numpy as np

    from gradscope.core.history import GROUPED_ONSETS, status_onsets
    from gradscope.core.watch import STATUS_NONFINITE

    names = [f"block{i}" for i in range(GROUPED_ONSETS + 3)]
    status = np.full(len(names), STATUS_NONFINITE, dtype=np.uint8)
    before = np.zeros(len(names), dtype=np.uint8)
    (event,) = status_onsets(4, names, status, before, np.full(len(names), np.nan))
    assert (event.step, event.kind, event.layer) == (4, "nonfinite", "block0")
    assert f"{len(names)} layers nonfinite" in event.message
    few = status_onsets(4, names[:2], status[:2], before[:2], np.zeros(2))
    assert [e.layer for e in few] == ["block0", "block1"]


def test_clip_none_overrides_a_scripts_clip(write_script):
    path = write_script(NAN_SCRIPT.replace('"lr": 0.1}', '"lr": 0.1, "clip": 1.0}'))
    assert load_with_settings(str(path), {})[1].clip == 1.0
    assert load_with_settings(str(path), {"clip": None})[1].clip is None


def test_rewind_then_the_current_settings_apply():
    """Rewind restores the model and optimizer state, then the current settings: the
    learning rate shown is the one the optimizer uses."""
    loaded, settings = load_with_settings(
        SEED_SCRIPT,
        {"steps": 4, "lr": 0.05, "loss_scale": 1.0, "rewind_depth": 5, "momentum": 0.9},
    )
    runner = StepRunner(loaded, settings)
    for _ in range(3):
        runner.step()
    runner.apply_settings(runner.settings.replaced(lr=0.5, momentum=0.5, weight_decay=1e-4))
    runner.rewind(1)
    group = runner.optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.5, 0.5, 1e-4)
    assert runner.settings.lr == 0.5
    assert runner.optimizer.state  # the momentum buffers of step 0 are back
    runner.step()
    assert runner.optimizer.param_groups[0]["lr"] == 0.5


def test_switching_the_optimizer_then_rewinding():
    loaded, settings = load_with_settings(
        SEED_SCRIPT, {"steps": 6, "lr": 0.01, "loss_scale": 1.0, "rewind_depth": 10}
    )
    runner = StepRunner(loaded, settings)
    runner.step()
    runner.step()
    runner.apply_settings(runner.settings.replaced(optimizer="adam", lr=1e-3))
    runner.step()  # step 2 with Adam
    runner.step()  # step 3
    runner.rewind(1)  # kept under SGD: the current optimizer (Adam) starts fresh
    assert isinstance(runner.optimizer, torch.optim.Adam)
    assert runner.optimizer.param_groups[0]["lr"] == 1e-3
    result = runner.step()  # raised KeyError: 'step' (SGD's state loaded into Adam)
    assert math.isfinite(result.loss)
    runner.step()
    runner.step()  # step 3, kept under Adam
    runner.rewind(3)
    assert isinstance(runner.optimizer, torch.optim.Adam)
    assert all("step" in state for state in runner.optimizer.state.values())
    runner.step()


COUNTED = """
import torch
from torch import nn

CALLS = []

class Blowup(nn.Module):
    def forward(self, x):
        return x / (0.0 if len(CALLS) == 3 else 1.0)

def build_model():
    return nn.Sequential(nn.Linear(3, 5), Blowup(), nn.Linear(5, 1))

def make_batch(batch_size, device):
    CALLS.append(batch_size)
    return torch.randn(batch_size, 3, device=device), torch.randn(batch_size, 1, device=device)
"""


def test_make_batch_is_called_exactly_once_per_step(write_script):
    """Also in trace mode, at the NaN step whose diagnosis re-runs the forward, and after
    a rewind."""
    for trace in (False, True):
        loaded, settings = load_with_settings(
            str(write_script(COUNTED, f"counted_{trace}.py")),
            {"steps": 5, "keep_going": True, "trace": trace, "rewind_depth": 5},
        )
        calls = loaded.make_batch.__wrapped__.__globals__["CALLS"]
        runner = StepRunner(loaded, settings)
        results = list(runner.run())
        assert len(calls) == len(results) == 5
        assert results[2].origin is not None  # the diagnosis re-ran step 2's forward
        runner.rewind(3)
        runner.step()
        assert len(calls) == 6


RANDOM_SCRIPT = """
import torch
from torch import nn

def build_model():
    return nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5), nn.Linear(8, 1))

def make_batch(batch_size, device):
    return torch.randn(batch_size, 3, device=device), torch.randn(batch_size, 1, device=device)
"""


def test_rewind_restores_the_random_state_so_the_steps_repeat_exactly(write_script):
    """The batches (torch.randn) and the dropout masks after a rewind are those of the first
    time: the random generator is restored with the model and the optimizer."""
    loaded, settings = load_with_settings(
        str(write_script(RANDOM_SCRIPT)), {"steps": 5, "rewind_depth": 5}
    )
    runner = StepRunner(loaded, settings)
    first = [runner.step().loss for _ in range(4)]
    torch.rand(100)  # what else the process draws in between must not matter
    runner.rewind(1)
    again = [runner.step().loss for _ in range(3)]
    assert again == first[1:]
