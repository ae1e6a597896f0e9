"""One origin per NaN/Inf episode in every route. A loss made non-finite at one step, with
training going on after it, spoils the weights through that step's update; every later
step's gradients are NaN because of it. That is one episode: one origin (the step, phase,
op and line that made the NaN), the spoiled weights as its events, never new "update"
origins at the steps after it."""

from __future__ import annotations

import json
from pathlib import Path

import lightning
import pytest
import torch
import transformers
from torch import nn

import gradscope
from gradscope.core.recording import RecordingReader
from gradscope.core.watch.episodes import SPOILED_WEIGHTS
from gradscope.integrations.lightning import GradScopeCallback as LightningCallback
from gradscope.integrations.transformers import GradScopeCallback as TransformersCallback

BAD_STEP = 3
STEPS = 7
BATCH = 4


def _line_of(text: str) -> int:
    with open(__file__) as handle:
        found = [n for n, line in enumerate(handle, start=1) if line.rstrip().endswith(text)]
    assert len(found) == 1, found
    return found[0]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.rand(STEPS * BATCH, 4, generator=generator) + 0.5
    labels = torch.rand(STEPS * BATCH, generator=generator) + 0.5
    labels[BAD_STEP * BATCH : (BAD_STEP + 1) * BATCH] = 0.0  # a batch of zero labels
    return inputs, labels


def _relative_loss(prediction: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return ((prediction - labels).square() / labels.abs().amin()).mean()  # episode marker


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, inputs, labels=None):
        prediction = self.head(torch.tanh(self.body(inputs))).squeeze(-1)
        loss = None if labels is None else _relative_loss(prediction, labels)
        return {"loss": loss, "logits": prediction}


class LitRegressor(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = Regressor()

    def training_step(self, batch, index):
        inputs, labels = batch
        return _relative_loss(self.model(inputs)["logits"], labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Rows(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.inputs, self.labels = _data()

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index):
        return {"inputs": self.inputs[index], "labels": self.labels[index]}


def _history(recording):
    with RecordingReader(recording) as reader:
        _, history = reader.load()
    return history


def _assert_one_episode(history, layers: set[str], where: tuple[str, str | None]) -> None:
    """``where``: the origin's phase and module (the loss computed in training_step is the
    loss phase; computed in the model's forward, the model's)."""
    assert len(history.origins) == 1, [o.describe() for o in history.origins]
    origin = history.origins[0]
    assert (origin.step, origin.phase, origin.module) == (BAD_STEP, *where)
    assert "div" in origin.op
    assert (origin.file, origin.line) == (__file__, _line_of("# episode marker"))
    assert [e.step for e in history.events if e.kind == "origin"] == [BAD_STEP]
    # The step's update wrote the NaN/Inf gradients into the weights: seen at the next step,
    # once per layer, named as the episode's consequence.
    spoiled = [e for e in history.events if e.kind == SPOILED_WEIGHTS]
    assert [e.step for e in spoiled] == [BAD_STEP + 1], spoiled
    for layer in layers:
        assert layer in spoiled[0].message
    assert f"origin at step {BAD_STEP}" in spoiled[0].message
    # training went on: every later step was non-finite, and recorded
    assert list(history.steps) == list(range(STEPS))


def test_lightning_callback_gives_one_origin_per_episode(tmp_path):
    torch.manual_seed(0)
    inputs, labels = _data()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, labels), batch_size=BATCH
    )
    recording = tmp_path / "lightning.gsrec"
    trainer = lightning.Trainer(
        callbacks=[LightningCallback(record=recording)],
        max_steps=STEPS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(LitRegressor(), loader)
    _assert_one_episode(_history(recording), {"model.body", "model.head"}, ("loss", None))


def test_transformers_callback_gives_one_origin_per_episode(tmp_path):
    torch.manual_seed(0)
    recording = tmp_path / "hf.gsrec"
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        max_grad_norm=0.0,
    )
    trainer = transformers.Trainer(
        model=Regressor(),
        args=args,
        train_dataset=Rows(),
        callbacks=[TransformersCallback(record=recording)],
    )
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(
        range(STEPS * BATCH)
    )
    trainer.train()
    _assert_one_episode(_history(recording), {"body", "head"}, ("forward", ""))


def _train_own_loop(watch, model, optimizer, number_steps: bool) -> None:
    inputs, labels = _data()
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        optimizer.zero_grad()
        loss = model(inputs[rows], labels[rows])["loss"]
        loss.backward()
        if number_steps:  # as a callback does: the library's own step number
            watch.step = step
        watch.collect(loss)
        optimizer.step()


@pytest.mark.parametrize("number_steps", [False, True])
def test_watch_gives_one_origin_per_episode(tmp_path, number_steps):
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    recording = tmp_path / "loop.gsrec"
    with gradscope.watch(model, record=recording, optimizer=optimizer) as watch:
        _train_own_loop(watch, model, optimizer, number_steps)
        assert len(watch.origins) == 1
    history = _history(recording)
    _assert_one_episode(history, {"body", "head"}, ("forward", ""))
    spoiled = next(e for e in history.events if e.kind == SPOILED_WEIGHTS)
    assert f"SGD.step of step {BAD_STEP}" in spoiled.message


def test_a_step_number_set_back_starts_a_new_episode():
    """A rewound run (the runner sets an earlier step) is a new timeline: a NaN after it
    is a new episode with an origin of its own."""
    torch.manual_seed(0)
    model = Regressor()
    inputs, labels = _data()
    rows = slice(BAD_STEP * BATCH, (BAD_STEP + 1) * BATCH)
    with gradscope.watch(model) as watch:
        for step in (BAD_STEP, BAD_STEP):
            watch.step = step
            model.zero_grad()
            loss = model(inputs[rows], labels[rows])["loss"]
            loss.backward()
            watch.collect(loss)
        assert [o.step for o in watch.origins] == [BAD_STEP, BAD_STEP]


@pytest.mark.parametrize("named_optimizer", [True, False])
def test_an_update_origin_names_the_step_whose_update_wrote_the_weights(named_optimizer):
    """A learning rate set to Inf at step 2 (a schedule gone wrong): step 2's gradients are
    finite, its optimizer step writes Inf/NaN weights, step 3 is the first non-finite one.
    The origin is the update of step 2, not of step 3 or 1."""
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.rand(6 * BATCH, 4) + 0.5
    labels = torch.rand(6 * BATCH) + 0.5
    broken_at = 2
    with gradscope.watch(model, optimizer=optimizer if named_optimizer else None) as watch:
        for step in range(5):
            rows = slice(step * BATCH, (step + 1) * BATCH)
            optimizer.zero_grad()
            loss = model(inputs[rows], labels[rows])["loss"]
            loss.backward()
            stats = watch.collect(loss)
            assert stats.nonfinite == (step > broken_at)
            if step == broken_at:
                optimizer.param_groups[0]["lr"] = float("inf")
            optimizer.step()
    assert len(watch.origins) == 1
    origin = watch.origins[0]
    assert (origin.step, origin.phase) == (broken_at, "update")
    assert origin.op == ("SGD.step" if named_optimizer else "optimizer.step")


def test_attach_gives_one_origin_per_episode(tmp_path, monkeypatch):
    """`gradscope attach` on an unmodified script: a NaN pixel in batch 6, training going on
    for five more steps with the spoiled weights."""
    from gradscope.cli import main

    script = Path(__file__).parent / "models" / "mnist_shaped.py"
    record = tmp_path / "attach.gsrec"
    monkeypatch.chdir(tmp_path)
    argv = ["attach", "--record", str(record), str(script), "--epochs", "2", "--nan-batch", "6"]
    assert main(argv) == 0
    history = _history(record)
    assert history.steps.tolist() == list(range(12))
    assert [(o.step, o.phase) for o in history.origins] == [(6, "input")]
    spoiled = [e for e in history.events if e.kind == SPOILED_WEIGHTS]
    assert [e.step for e in spoiled] == [7]
    assert "origin at step 6" in spoiled[0].message


NAN_DATA_SCRIPT = """
import torch
from torch import nn

CONFIG = {"steps": 6, "batch_size": 4, "lr": 0.1}
batches = 0


def build_model():
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))


def make_batch(batch_size, device):
    global batches
    batches += 1
    inputs = torch.randn(batch_size, 3, device=device)
    if batches == 3:  # the third batch, step 2
        inputs[1, 0] = float("nan")
    return inputs, torch.randn(batch_size, 1, device=device)
"""


def test_gradscope_run_keep_going_gives_one_origin_per_episode(tmp_path, capsys):
    """`gradscope run --keep-going` (the app's worker drives the same StepRunner): one origin
    in the report, and the spoiled weights in the history the run's steps make."""
    from gradscope.cli import main
    from gradscope.core.history import RunHistory
    from gradscope.core.runner import StepRunner
    from gradscope.core.sources import load_with_settings

    script = tmp_path / "nan_data.py"
    script.write_text(NAN_DATA_SCRIPT)
    report = tmp_path / "run.json"
    assert main(["run", str(script), "--keep-going", "--json", str(report)]) == 0
    capsys.readouterr()
    data = json.loads(report.read_text())
    assert data["steps_run"] == 6
    assert [(o["step"], o["phase"]) for o in data["nonfinite_origins"]] == [(2, "input")]

    loaded, settings = load_with_settings(str(script), {"keep_going": True})
    runner = StepRunner(loaded, settings)
    history = RunHistory()
    try:
        for result in runner.run():
            layers = runner.watch.layers
            history.append(
                result.step,
                result.loss,
                result.stats,
                [layer.name for layer in layers],
                origin=result.origin,
            )
    finally:
        runner.close()
    assert [o.step for o in history.origins] == [2]
    spoiled = [e for e in history.events if e.kind == SPOILED_WEIGHTS]
    assert [e.step for e in spoiled] == [3]
    assert "SGD.step of step 2" in spoiled[0].message


class TinyInputs(lightning.LightningModule):
    """Inputs scaled by 1e-9: the first layer's gradient stays tiny at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 8, bias=False)
        self.last = nn.Linear(8, 1)

    def training_step(self, batch, index):
        inputs, labels = batch
        prediction = self.last(torch.tanh(self.first(inputs * 1e-9))).squeeze(-1)
        return (prediction - labels).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_callback_step_number_keeps_a_vanishing_count_going(tmp_path):
    """A callback numbers each step as its library does; that is the same timeline, so a
    layer under the threshold for vanish_steps steps is vanishing (the count used to start
    over at every step, and no callback run ever showed vanishing)."""
    torch.manual_seed(0)
    inputs, labels = _data()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, labels.clamp(min=0.5)), batch_size=BATCH
    )
    recording = tmp_path / "vanishing.gsrec"
    trainer = lightning.Trainer(
        callbacks=[LightningCallback(record=recording, vanish_threshold=1e-6)],
        max_steps=STEPS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(TinyInputs(), loader)
    history = _history(recording)
    assert history.worst("last") == "ok"
    assert history.worst("first") == "vanishing"
    assert history.worst_first_seen("first") == 2  # the third step under the threshold
