"""``statistics=`` everywhere (issue #36): ``gradscope run --statistic MODULE:CLASS``,
``gradscope attach --statistic MODULE:CLASS`` on an unmodified script, and the Lightning
callback; a spec that names no statistic is one clear line."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning
import numpy as np
import pytest
import torch
from torch import nn

from gradscope.cli import main
from gradscope.core.errors import GradScopeError
from gradscope.core.watch.statistic_loader import load_statistic_class
from gradscope.integrations.lightning import GradScopeCallback as LightningCallback

TESTS = Path(__file__).parent
MNIST = TESTS / "models" / "mnist_shaped.py"

# A user's statistics module: GradRMS as the README writes it, noting each parameter it
# measured (shapes only: no host read) so a test sees that the watch called it.
STATS = """
import gradscope

MEASURED = []


class GradRMS(gradscope.Statistic):
    name = "grad_rms"
    label = "RMS of the gradient"
    combine = "max"
    every = 1

    def parameter(self, grad, weight):
        MEASURED.append(tuple(grad.shape))
        return grad.float().pow(2).mean().sqrt()


class OutRMS(gradscope.Statistic):
    name = "out_rms"
    every = 2

    def output(self, module, output):
        MEASURED.append(("output", type(module).__name__))
        return output.float().pow(2).mean().sqrt()


NOT_A_STATISTIC = 3


class Needs(gradscope.Statistic):
    name = "needs"

    def __init__(self, something):
        self.something = something

    def parameter(self, grad, weight):
        return grad.sum()
"""

MODEL = """
import torch
from torch import nn

def build_model():
    return nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 1))
def make_batch(batch_size, device):
    return torch.randn(batch_size, 10, device=device), torch.randn(batch_size, 1, device=device)
"""


@pytest.fixture
def stats_module(tmp_path, monkeypatch):
    """A statistics module in the current folder, under a name of this test's own."""
    name = f"mystats_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(STATS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


def test_run_measures_the_statistics_given_by_module_and_class(tmp_path, stats_module, capsys):
    script = tmp_path / "model.py"
    script.write_text(MODEL)
    code = main(
        [
            "run",
            str(script),
            "--steps",
            "3",
            "--statistic",
            f"{stats_module}:GradRMS",
            "--statistic",
            f"{stats_module}:OutRMS",
        ]
    )
    assert code == 0, capsys.readouterr().err
    measured = sys.modules[stats_module].MEASURED
    # GradRMS: 4 parameters at each of the 3 steps; OutRMS: 2 Linear layers at steps 0, 2.
    assert sorted(m for m in measured if m[0] != "output") == sorted(
        [(50, 10), (50,), (1, 50), (1,)] * 3
    )
    assert measured.count(("output", "Linear")) == 4


def test_run_says_in_one_line_when_a_spec_names_no_statistic(tmp_path, stats_module, capsys):
    script = tmp_path / "model.py"
    script.write_text(MODEL)
    code = main(["run", str(script), "--steps", "1", "--statistic", "nowhere_at_all:GradRMS"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--statistic nowhere_at_all:GradRMS: no module 'nowhere_at_all'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("GradRMS", "expected MODULE:CLASS"),
        ("{m}:", "expected MODULE:CLASS"),
        ("{m}:Missing", "has no Missing"),
        ("{m}:NOT_A_STATISTIC", "not a subclass of gradscope.Statistic"),
        ("{m}:Needs", r"Needs\(\) raised TypeError"),
        ("no_such_file.py:GradRMS", "no file no_such_file.py"),
    ],
)
def test_a_bad_spec_is_one_clear_line(stats_module, spec, says):
    with pytest.raises(GradScopeError, match=says) as raised:
        load_statistic_class(spec.format(m=stats_module))
    assert "\n" not in str(raised.value)


def test_a_spec_may_name_a_file(tmp_path, stats_module):
    found = load_statistic_class(f"{tmp_path / (stats_module + '.py')}:GradRMS")
    assert found.__name__ == "GradRMS" and found.name == "grad_rms"


def test_attach_measures_the_statistics_on_an_unmodified_script(tmp_path, stats_module, capfd):
    code = main(
        [
            "attach",
            "--record",
            str(tmp_path / "mnist.gsrec"),
            "--statistic",
            f"{stats_module}:GradRMS",
            str(MNIST),
            "--epochs",
            "1",
        ]
    )
    assert code == 0, capfd.readouterr().err
    measured = sys.modules[stats_module].MEASURED
    steps = 6  # 192 samples / 32 per batch
    # conv1, conv2, fc1, fc2: a weight and a bias each, at every step
    assert len(measured) == 8 * steps


def test_attach_refuses_a_bad_spec_before_the_script_runs(tmp_path, stats_module, capfd):
    code = main(["attach", "--statistic", f"{stats_module}:Missing", str(MNIST)])
    out, err = capfd.readouterr()
    assert code == 2
    assert "has no Missing" in err
    assert out == ""  # the script never ran


class TinyModule(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.grad_rms: list[list[float]] = []

    def training_step(self, batch, index):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def on_before_optimizer_step(self, optimizer):  # after the callbacks'
        self.grad_rms.append(
            [
                max(float(p.grad.double().square().mean().sqrt()) for p in m.parameters())
                for m in (self.net[0], self.net[2])
            ]
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Collected:
    """A sink keeping each step's figures (what the recording will store by name)."""

    def __init__(self) -> None:
        self.figures: list[dict] = []

    def on_step(self, watch, stats) -> None:
        self.figures.append(dict(stats.figures))

    def close(self) -> None:
        pass


def test_the_lightning_callback_passes_statistics_to_the_watch(tmp_path, stats_module):
    grad_rms = load_statistic_class(f"{stats_module}:GradRMS")()
    sink = Collected()
    callback = LightningCallback(record=tmp_path / "run.gsrec", statistics=[grad_rms], sinks=[sink])
    module = TinyModule()
    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(16, 8, generator=generator), torch.randint(0, 3, (16,), generator=generator)
    )
    trainer = lightning.Trainer(
        callbacks=[callback],
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    assert len(sink.figures) == 3
    for figures, expected in zip(sink.figures, module.grad_rms, strict=True):
        np.testing.assert_allclose(figures["grad_rms"], expected, rtol=1e-5)


class TokenData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def test_the_transformers_callback_passes_statistics_to_the_watch(tmp_path, stats_module):
    import transformers

    from gradscope.integrations.transformers import GradScopeCallback as TransformersCallback

    grad_rms = load_statistic_class(f"{stats_module}:GradRMS")()
    out_rms = load_statistic_class(f"{stats_module}:OutRMS")()
    sink = Collected()
    callback = TransformersCallback(
        record=tmp_path / "hf.gsrec", statistics=[grad_rms, out_rms], sinks=[sink]
    )
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    transformers.Trainer(
        model=model, args=args, train_dataset=TokenData(), callbacks=[callback]
    ).train()
    assert len(sink.figures) == 3
    for step, figures in enumerate(sink.figures):
        assert np.isfinite(figures["grad_rms"]).all() and figures["grad_rms"].max() > 0
        # OutRMS every 2nd step: on each watched module's forward output
        assert ("out_rms" in figures) == (step % 2 == 0), step
        if step % 2 == 0:
            assert np.isfinite(figures["out_rms"]).all() and figures["out_rms"].min() > 0
