"""The Lightning and transformers Trainer callbacks locate a NaN/Inf that comes from the
data at some step, with no locate= anywhere: each keeps its step (Lightning's batch and
training_step, the Trainer's inputs and compute_loss) and the watch repeats it; the
recording's origin names the user's module and line, and its trace leads there."""

from __future__ import annotations

import json

import lightning
import torch
import transformers
from torch import nn

from gradscope.cli import main
from gradscope.core.recording import RecordingReader
from gradscope.integrations.lightning import GradScopeCallback as LightningCallback
from gradscope.integrations.transformers import GradScopeCallback as TransformersCallback

BAD_BATCH = 3


def _line_of(text: str) -> int:
    with open(__file__) as handle:
        found = [n for n, line in enumerate(handle, start=1) if line.rstrip().endswith(text)]
    assert len(found) == 1, found
    return found[0]


class LogFeatures(nn.Module):
    def forward(self, x):
        return torch.log(x.abs())  # log of the data marker


class Regressor(nn.Module):
    """A model a Trainer can train: it computes its loss when given labels."""

    def __init__(self) -> None:
        super().__init__()
        self.features = LogFeatures()
        self.head = nn.Linear(4, 1)

    def forward(self, inputs, labels=None):
        prediction = self.head(self.features(inputs)).squeeze(-1)
        loss = None if labels is None else (prediction - labels).square().mean()
        return {"loss": loss, "logits": prediction}


def _data(count: int = 32, batch_size: int = 4) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.rand(count, 4, generator=generator) + 0.5
    inputs[BAD_BATCH * batch_size + 1, 2] = 0.0  # one zero feature in one batch
    return inputs


class Tabular(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.inputs = _data()
        self.labels = torch.randn(len(self.inputs))

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index):
        return {"inputs": self.inputs[index], "labels": self.labels[index]}


class LitRegressor(lightning.LightningModule):
    """training_step calls the submodules itself, never this module's own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.features = LogFeatures()
        self.head = nn.Linear(4, 1)

    def training_step(self, batch, index):
        x, y = batch
        prediction = self.head(self.features(x)).squeeze(-1)
        loss = nn.functional.mse_loss(prediction, y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _report(recording, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["report", str(recording), "--json", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


def _assert_names_the_log(report):
    origin = report["first_nonfinite"]
    assert origin["step"] == BAD_BATCH
    assert (origin["phase"], origin["module"], origin["op"]) == ("forward", "features", "torch.log")
    assert (origin["file"], origin["line"]) == (__file__, _line_of("# log of the data marker"))
    first = next(e for e in origin["trace"] if e["nonfinite"] > 0)
    assert first["module"] == "features" and first["phase"] == "forward"


def test_lightning_locates_a_nan_from_the_data(tmp_path, capsys):
    torch.manual_seed(0)
    data = _data()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data, torch.randn(len(data))), batch_size=4
    )
    recording = tmp_path / "lightning.gsrec"
    trainer = lightning.Trainer(
        callbacks=[LightningCallback(record=recording)],
        max_steps=5,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(LitRegressor(), loader)
    with RecordingReader(recording) as reader:
        _, history = reader.load()
    assert history.first_nonfinite is not None
    _assert_names_the_log(_report(recording, tmp_path, capsys))


def test_transformers_trainer_locates_a_nan_from_the_data(tmp_path, capsys):
    torch.manual_seed(0)
    recording = tmp_path / "hf.gsrec"
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=5,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        max_grad_norm=0.0,
    )
    trainer = transformers.Trainer(
        model=Regressor(),
        args=args,
        train_dataset=Tabular(),
        callbacks=[TransformersCallback(record=recording)],
    )
    # the Trainer's sampler shuffles: put the bad row where step BAD_BATCH reads it
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(range(32))
    trainer.train()
    _assert_names_the_log(_report(recording, tmp_path, capsys))


class HingedLossTrainer(transformers.Trainer):
    """Its own loss, outside the model: finite outputs, a non-finite loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        margin = (1.0 - outputs["logits"] * labels).clamp(min=0.0)
        loss = (margin / labels.abs().amin()).mean()  # loss outside the model marker
        return (loss, outputs) if return_outputs else loss


def test_transformers_trainer_repeats_its_compute_loss(tmp_path, capsys):
    torch.manual_seed(0)
    recording = tmp_path / "hinged.gsrec"
    data = Tabular()
    data.inputs = data.inputs.clamp(min=0.5)  # no zero feature: the model stays finite
    data.labels[BAD_BATCH * 4 : BAD_BATCH * 4 + 4] = 0.0  # a batch of zero labels
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=5,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        max_grad_norm=0.0,
    )
    trainer = HingedLossTrainer(
        model=Regressor(),
        args=args,
        train_dataset=data,
        callbacks=[TransformersCallback(record=recording)],
    )
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(range(32))
    trainer.train()
    origin = _report(recording, tmp_path, capsys)["first_nonfinite"]
    assert origin["step"] == BAD_BATCH
    assert (origin["phase"], origin["module"]) == ("loss", None)
    assert "div" in origin["op"]
    assert (origin["file"], origin["line"]) == (
        __file__,
        _line_of("# loss outside the model marker"),
    )
