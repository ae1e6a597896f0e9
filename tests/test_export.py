"""TensorBoard and W&B exports: the values a dashboard gets are the watch's, step by step,
read back with tensorboard's own EventAccumulator and from W&B's offline run file."""

from __future__ import annotations

import glob
import json
import math
import struct
import sys
import time

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.errors import GradScopeError
from gradscope.core.history import MISSING
from gradscope.core.recording import RecordingReader
from gradscope.core.watch import STATUS_NONFINITE


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def _train(watch, model, steps, nan_step=None):
    """``steps`` SGD steps; at ``nan_step`` the batch holds a NaN. Returns the stats."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    collected = []
    for step in range(steps):
        x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
        if step == nan_step:
            x[2, 1] = float("nan")
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        collected.append(watch.collect(loss))
        optimizer.step()
    watch.close()
    return collected


def _scalars(logdir) -> EventAccumulator:
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _series(events, tag):
    return {e.step: e.value for e in events.Scalars(tag)}


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_watch_tensorboard_writes_the_watch_values_per_step(tmp_path):
    model = _model()
    watch = gradscope.watch(model, tensorboard=tmp_path / "tb", detail_every=3)
    stats = _train(watch, model, 7, nan_step=5)
    events = _scalars(tmp_path / "tb")
    names = [layer.name for layer in watch.layers]
    assert names == ["0", "2"]
    for index, name in enumerate(names):
        grad = _series(events, f"gradscope/grad_norm/{name}")
        assert sorted(grad) == list(range(7))
        for s in stats:
            assert _same(grad[s.step], float(np.float32(s.grad_norm[index])))
        # detail-only statistics at detail steps only (every 3rd, and the non-finite step)
        max_abs = _series(events, f"gradscope/max_abs/{name}")
        assert sorted(max_abs) == [s.step for s in stats if s.max_abs is not None]
        assert sorted(max_abs) == [0, 3, 5, 6]
        flags = _series(events, f"gradscope/nonfinite/{name}")
        # the NaN batch at step 5, then the NaN weights SGD wrote with it at step 6
        assert flags == {step: (1.0 if step >= 5 else 0.0) for step in range(7)}
        assert flags == {s.step: float(s.status[index] == STATUS_NONFINITE) for s in stats}
    # NaN written as NaN, never dropped
    assert math.isnan(_series(events, "gradscope/grad_norm/0")[5])
    total = _series(events, "gradscope/total_grad_norm")
    assert [_same(total[s.step], float(np.float32(s.total_grad_norm))) for s in stats] == [True] * 7
    text = events.Tensors("gradscope/first_nonfinite")
    assert [t.step for t in text] == [5]
    summary = text[0].tensor_proto.string_val[0].decode()
    assert summary.startswith("step 5:") and "NAN" in summary.upper()


def test_report_tensorboard_equals_the_recording_per_step(tmp_path):
    model = _model()
    watch = gradscope.watch(model, record=tmp_path / "run.gsrec", detail_every=2)
    _train(watch, model, 6, nan_step=4)
    code = main(
        ["report", str(tmp_path / "run.gsrec"), "--tensorboard", str(tmp_path / "converted")]
    )
    assert code == 0
    with RecordingReader(tmp_path / "run.gsrec") as reader:
        _, history = reader.load()
    events = _scalars(tmp_path / "converted")
    steps = history.steps.tolist()
    assert steps == list(range(6))
    for name in history.layer_names:
        recorded = history.series("grad_norm", name)
        written = _series(events, f"gradscope/grad_norm/{name}")
        assert sorted(written) == steps
        assert all(_same(written[s], float(recorded[row])) for row, s in enumerate(steps))
        # statistics not measured at a step are not written at all: every 2nd step and
        # the non-finite ones
        measured = [
            s for row, s in enumerate(steps) if history.series("max_abs", name)[row] != MISSING
        ]
        assert measured == [0, 2, 4, 5]
        assert sorted(_series(events, f"gradscope/max_abs/{name}")) == measured
        assert _series(events, f"gradscope/nonfinite/{name}")[4] == 1.0
    text = events.Tensors("gradscope/first_nonfinite")
    assert [t.step for t in text] == [4]


def test_live_and_converted_events_agree(tmp_path):
    model = _model()
    watch = gradscope.watch(
        model, record=tmp_path / "run.gsrec", tensorboard=tmp_path / "live", detail_every=2
    )
    _train(watch, model, 5)
    assert (
        main(["report", str(tmp_path / "run.gsrec"), "--tensorboard", str(tmp_path / "conv")]) == 0
    )
    live, converted = _scalars(tmp_path / "live"), _scalars(tmp_path / "conv")
    assert sorted(live.Tags()["scalars"]) == sorted(converted.Tags()["scalars"])
    for tag in live.Tags()["scalars"]:
        assert _series(live, tag) == _series(converted, tag), tag


def test_an_unwritable_tensorboard_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(GradScopeError, match="cannot write TensorBoard events"):
        gradscope.watch(_model(), tensorboard=blocker / "tb")


def test_a_missing_package_names_the_pip_install(monkeypatch, tmp_path):
    for name in [n for n in sys.modules if n.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an absent package gives
    with pytest.raises(GradScopeError, match=r'pip install "gradscope\[tensorboard\]"'):
        gradscope.watch(_model(), tensorboard=tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


# -- W&B --------------------------------------------------------------------------------
def _wandb_history(run_dir) -> list[dict]:
    """The history rows of an offline run, read from its ``.wandb`` file (a LevelDB-style
    log of W&B's protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(f"{run_dir}/run-*.wandb")
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    records, pending, position, block = [], b"", 7, 32768
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind in (2, 3):
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
            pending = b""
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def test_wandb_offline_history_holds_the_keys(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="gradscope-test")
    try:
        model = _model()
        watch = gradscope.watch(model, wandb=True, detail_every=2)
        stats = _train(watch, model, 4, nan_step=3)
        run_dir = run.dir.rsplit("/files", 1)[0]
    finally:
        run.finish()
    # wandb-core may still be writing the run file when finish() returns (seen here: a
    # file holding only its header, now and then)
    deadline = time.monotonic() + 30
    rows = []
    while len(rows) < 4 and time.monotonic() < deadline:
        rows = [row for row in _wandb_history(run_dir) if "gradscope/step" in row]
        time.sleep(0.2)
    assert [row["gradscope/step"] for row in rows] == [0, 1, 2, 3]  # one log per step
    for row, s in zip(rows, stats, strict=True):
        for index, name in enumerate(["0", "2"]):
            assert _same(row[f"gradscope/grad_norm/{name}"], float(s.grad_norm[index]))
            assert row[f"gradscope/nonfinite/{name}"] == (1.0 if s.step == 3 else 0.0)
            assert (f"gradscope/max_abs/{name}" in row) == (s.max_abs is not None)
        assert "gradscope/total_grad_norm" in row
    assert rows[3]["gradscope/first_nonfinite"].startswith("step 3:")


def test_wandb_without_a_run_says_to_start_one(monkeypatch):
    import wandb

    monkeypatch.setattr(wandb, "run", None)
    with pytest.raises(GradScopeError, match=r"wandb.init"):
        gradscope.watch(_model(), wandb=True)


# -- the training-library callbacks ------------------------------------------------------
def _lightning_module():
    import lightning

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

        def training_step(self, batch, index):
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)  # the user's own tag, beside GradScope's
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module()


def _loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(40, 8, generator=generator), torch.randint(0, 3, (40,), generator=generator)
    )
    return torch.utils.data.DataLoader(data, batch_size=4)


def _fit(tmp_path, callback, logger):
    import lightning

    torch.manual_seed(0)
    trainer = lightning.Trainer(
        max_steps=5,
        accelerator="cpu",
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[callback],
    )
    trainer.fit(_lightning_module(), _loader())
    with RecordingReader(callback.path) as reader:
        return reader.load()[1]


def test_lightning_log_to_trainer_writes_into_the_trainers_tensorboard(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    from gradscope.integrations.lightning import GradScopeCallback

    logger = TensorBoardLogger(tmp_path / "logs", name="exp")
    callback = GradScopeCallback(record=tmp_path / "run.gsrec", log_to_trainer=True)
    history = _fit(tmp_path, callback, logger)
    events = _scalars(logger.log_dir)
    tags = events.Tags()["scalars"]
    assert "train_loss" in tags  # the user's own
    for name in ("net.0", "net.2"):
        written = _series(events, f"gradscope/grad_norm/{name}")
        recorded = history.series("grad_norm", name).tolist()
        assert written == dict(zip(history.steps.tolist(), recorded, strict=True))
    assert sorted(_series(events, "gradscope/total_grad_norm")) == [0, 1, 2, 3, 4]


def test_lightning_log_to_trainer_writes_into_a_csv_logger(tmp_path):
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from gradscope.integrations.lightning import GradScopeCallback

    logger = CSVLogger(tmp_path / "logs", name="exp")
    callback = GradScopeCallback(record=tmp_path / "run.gsrec", log_to_trainer=True)
    history = _fit(tmp_path, callback, logger)
    with open(f"{logger.log_dir}/metrics.csv", newline="") as file:
        rows = [r for r in csv.DictReader(file) if r.get("gradscope/grad_norm/net.0")]
    assert [int(r["step"]) for r in rows] == history.steps.tolist()
    recorded = history.series("grad_norm", "net.0").tolist()
    assert [float(r["gradscope/grad_norm/net.0"]) for r in rows] == pytest.approx(recorded)


def test_lightning_callback_tensorboard_folder(tmp_path):
    from gradscope.integrations.lightning import GradScopeCallback

    callback = GradScopeCallback(record=tmp_path / "run.gsrec", tensorboard=tmp_path / "tb")
    history = _fit(tmp_path, callback, False)
    written = _series(_scalars(tmp_path / "tb"), "gradscope/grad_norm/net.2")
    assert written == dict(
        zip(history.steps.tolist(), history.series("grad_norm", "net.2").tolist(), strict=True)
    )


def test_transformers_callback_tensorboard_folder(tmp_path):
    import transformers

    from gradscope.integrations.transformers import GradScopeCallback

    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 32, (12, 8))]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2,
        report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    callback = GradScopeCallback(record=tmp_path / "hf.gsrec", tensorboard=tmp_path / "tb")
    transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
        callbacks=[callback],
    ).train()  # fmt: skip
    with RecordingReader(tmp_path / "hf.gsrec") as reader:
        history = reader.load()[1]
    events = _scalars(tmp_path / "tb")
    name = "transformer.h.0.attn.c_attn"
    written = _series(events, f"gradscope/grad_norm/{name}")
    assert written == dict(
        zip(history.steps.tolist(), history.series("grad_norm", name).tolist(), strict=True)
    )


def test_update_ratio_is_written_once_its_optimizer_step_ran(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    watch = gradscope.watch(
        model, tensorboard=tmp_path / "tb", update_ratio=True, optimizer=optimizer, detail_every=1
    )
    collected = []
    for _ in range(3):
        x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        collected.append(watch.collect(loss))
        optimizer.step()
    watch.close()
    written = _series(_scalars(tmp_path / "tb"), "gradscope/update_ratio/0")
    assert all(s.update_ratio is not None for s in collected)
    assert written == {s.step: float(np.float32(s.update_ratio[0])) for s in collected}
