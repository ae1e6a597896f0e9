"""Early warnings (#37) on the other routes into the watch: ``gradscope attach
--early-warnings/--fail-on-warning`` and the Trainer callbacks' ``early_warnings=True``."""

from __future__ import annotations

import os
from pathlib import Path

import lightning
import torch
from torch.nn import functional as F

from gradscope.cli import main
from gradscope.core.recording import RecordingReader
from gradscope.integrations.lightning import GradScopeCallback as LightningCallback
from tests.models.drift_cases import CLASSES, FEATURES, ResidualClassifier

# The float16 residual stream of the drift cases: its blocks warn within 40 steps.
_DRIFTING_SCRIPT = """
import sys
import torch
from torch.nn import functional as F
from tests.models.drift_cases import CLASSES, FEATURES, ResidualClassifier

torch.manual_seed(0)
prototypes = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(4))
model = ResidualClassifier(torch.float16)
optimizer = torch.optim.Adam(model.parameters(), lr=float(sys.argv[1]))
for step in range(40):
    labels = torch.randint(0, CLASSES, (64,))
    inputs = prototypes[labels] + 2 * torch.randn(64, FEATURES)
    loss = F.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained")
"""


def _attach(tmp_path: Path, *args: str) -> int:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return main(["attach", *args])
    finally:
        os.chdir(cwd)


def _warnings_of(path: Path) -> tuple[bool, list]:
    with RecordingReader(path) as reader:
        _, history = reader.load()
        return reader.looked_for_warnings, history.warnings


def test_attach_warns_records_the_warnings_and_fails_on_them(tmp_path, capfd):
    script = tmp_path / "drifting.py"
    script.write_text(_DRIFTING_SCRIPT)
    record = tmp_path / "run.gsrec"
    code = _attach(tmp_path, "--record", str(record), "--early-warnings", str(script), "0.2")
    assert code == 0  # warned, but not asked to fail
    looked, warnings = _warnings_of(record)
    assert looked and warnings and warnings[0].module.startswith("blocks.")
    err = capfd.readouterr().err
    assert f"early warning: {warnings[0].describe()}" in err

    failing = tmp_path / "failing.gsrec"
    code = _attach(tmp_path, "--record", str(failing), "--fail-on-warning", str(script), "0.2")
    assert code == 1
    assert [w.to_json() for w in _warnings_of(failing)[1]] == [w.to_json() for w in warnings]


def test_attach_without_the_option_looks_for_none_and_a_calm_run_passes(tmp_path, capfd):
    script = tmp_path / "drifting.py"
    script.write_text(_DRIFTING_SCRIPT)
    record = tmp_path / "plain.gsrec"
    assert _attach(tmp_path, "--record", str(record), str(script), "0.2") == 0
    assert _warnings_of(record) == (False, [])
    assert "early warning" not in capfd.readouterr().err
    calm = tmp_path / "calm.gsrec"
    assert _attach(tmp_path, "--record", str(calm), "--fail-on-warning", str(script), "1e-3") == 0
    assert _warnings_of(calm) == (True, [])


class _DriftingModule(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = ResidualClassifier(torch.float16)

    def training_step(self, batch, index):
        inputs, labels = batch
        return F.cross_entropy(self.net(inputs), labels)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.2)


def test_the_lightning_callback_takes_early_warnings(tmp_path):
    torch.manual_seed(0)
    prototypes = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(4))
    labels = torch.randint(0, CLASSES, (40 * 64,))
    data = torch.utils.data.TensorDataset(
        prototypes[labels] + 2 * torch.randn(40 * 64, FEATURES), labels
    )
    record = tmp_path / "run.gsrec"
    callback = LightningCallback(record=record, early_warnings=True)
    trainer = lightning.Trainer(
        callbacks=[callback],
        max_steps=40,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_DriftingModule(), torch.utils.data.DataLoader(data, batch_size=64))
    looked, warnings = _warnings_of(record)
    assert looked and warnings
    assert warnings[0].module.startswith("net.blocks.")


def _drifting_watch(steps: int = 40, **options) -> list:
    """The drifting case under ``gradscope.watch(early_warnings=True, **options)``: its
    warnings."""
    import gradscope

    torch.manual_seed(0)
    prototypes = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(4))
    model = ResidualClassifier(torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.2)
    with gradscope.watch(model, early_warnings=True, **options) as watch:
        for _ in range(steps):
            labels = torch.randint(0, CLASSES, (64,))
            loss = F.cross_entropy(
                model(prototypes[labels] + 2 * torch.randn(64, FEATURES)), labels
            )
            optimizer.zero_grad()
            loss.backward()
            watch.collect(loss)
            optimizer.step()
        return list(watch.early_warnings.warnings)


def _warning_texts(logdir: Path) -> dict[str, tuple[int, str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    found = {}
    for tag in events.Tags()["tensors"]:
        if tag.startswith("gradscope/warnings/"):
            (event,) = events.Tensors(tag)
            found[tag] = (event.step, event.tensor_proto.string_val[0].decode())
    return found


def test_tensorboard_gets_each_warning_as_text_live_and_from_the_recording(tmp_path):
    warnings = _drifting_watch(tensorboard=tmp_path / "live", record=tmp_path / "run.gsrec")
    assert warnings
    expected = {
        f"gradscope/warnings/{w.module}/{w.kind.replace(' ', '_')}": (
            w.step,
            f"{w.describe()}\n\nhint: {w.hint}",
        )
        for w in warnings
    }
    assert _warning_texts(tmp_path / "live") == expected
    assert (
        main(["report", str(tmp_path / "run.gsrec"), "--tensorboard", str(tmp_path / "rec")]) == 0
    )
    assert _warning_texts(tmp_path / "rec") == expected


def test_wandb_logs_each_warning_at_its_step(tmp_path, monkeypatch):
    import time

    import wandb

    from tests.test_export import _wandb_history

    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="gradscope-test")
    try:
        warnings = _drifting_watch(wandb=True)
        run_dir = run.dir.rsplit("/files", 1)[0]
    finally:
        run.finish()
    assert warnings
    deadline = time.monotonic() + 30
    rows: list = []
    while len(rows) < 40 and time.monotonic() < deadline:
        rows = [row for row in _wandb_history(run_dir) if "gradscope/step" in row]
        time.sleep(0.2)
    logged = {
        (row["gradscope/step"], key): value
        for row in rows
        for key, value in row.items()
        if key.startswith("gradscope/warnings/")
    }
    assert logged == {
        (w.step, f"gradscope/warnings/{w.module}/{w.kind.replace(' ', '_')}"): (
            f"{w.describe()}\n\nhint: {w.hint}"
        )
        for w in warnings
    }
