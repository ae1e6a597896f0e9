"""``GradRMS`` and ``OutRMS`` exactly as the README's example of ``gradscope.Statistic``
(issue #36), through a real watch, reach every sink by name with the values plain torch
gives: the recording (and back), ``report --json`` (null on the steps not due), CSV and
TensorBoard (the live sink and ``report --tensorboard``).

Needs the engine's public protocol (``gradscope.Statistic``); skipped where it is absent.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import torch
from models.issue_statistics import GradRMS, OutRMS
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.facts import RESERVED_STATISTIC_NAMES
from gradscope.core.history import STATISTICS
from gradscope.core.recording import RecordingReader

STEPS = 5


def _train(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3), nn.Tanh(), nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "run.gsrec"
    watch = gradscope.watch(
        model, statistics=[GradRMS(), OutRMS()], record=path, tensorboard=tmp_path / "live"
    )
    names = [layer.name for layer in watch.layers]
    modules = dict(model.named_modules())
    outputs = {}
    hooks = [
        modules[n].register_forward_hook(
            lambda m, a, out, n=n: outputs.__setitem__(n, out.detach())
        )
        for n in names
    ]
    grad_rms, out_rms = [], []
    try:
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = ((model(torch.randn(16, 5)) - torch.randn(16, 1)) ** 2).mean()
            loss.backward()
            watch.collect(loss)
            grad_rms.append(
                [
                    max(float(p.grad.pow(2).mean().sqrt()) for p in modules[n].parameters())
                    for n in names
                ]
            )
            out_rms.append([float(outputs[n].pow(2).mean().sqrt()) for n in names])
            optimizer.step()
    finally:
        for hook in hooks:
            hook.remove()
        watch.close()
    return path, names, np.array(grad_rms), np.array(out_rms)


def test_user_statistics_reach_the_recording_report_csv_and_tensorboard(tmp_path):
    path, names, grad_rms, out_rms = _train(tmp_path)
    due = np.arange(STEPS) % 2 == 0

    with RecordingReader(path) as reader:
        _, history = reader.load()
    assert history.figure_due("out_rms").tolist() == due.tolist()
    assert history.statistic_info("grad_rms").shown_as == "RMS of the gradient"
    assert history.statistic_info("out_rms").every == 2
    np.testing.assert_allclose(history.matrix("grad_rms"), grad_rms, rtol=1e-5)
    np.testing.assert_allclose(history.matrix("out_rms")[due], out_rms[due], rtol=1e-5)

    report, table = tmp_path / "report.json", tmp_path / "steps.csv"
    tensorboard = tmp_path / "converted"
    args = ["report", str(path), "--json", str(report), "--csv", str(table)]
    assert main([*args, "--tensorboard", str(tensorboard)]) == 0
    layers = json.loads(report.read_text(encoding="utf-8"))["layers"]
    # A layer's other keys are the ones a statistic may not be named (else it is dropped).
    assert set(layers[0]) - {"grad_rms", "out_rms", *STATISTICS} <= RESERVED_STATISTIC_NAMES
    for column, entry in enumerate(layers):
        assert [v is None for v in entry["out_rms"]] == (~due).tolist()
        measured = [v for v in entry["out_rms"] if v is not None]
        np.testing.assert_allclose(measured, out_rms[due, column], rtol=1e-5)
        np.testing.assert_allclose(entry["grad_rms"], grad_rms[:, column], rtol=1e-5)
    with open(table, newline="", encoding="utf-8") as file:
        reader_rows = csv.DictReader(file)
        rows = [row for row in reader_rows if row["layer"] == names[-1]]
    assert set(reader_rows.fieldnames) - {"grad_rms", "out_rms", *STATISTICS} <= (
        RESERVED_STATISTIC_NAMES
    )
    assert [row["out_rms"] == "" for row in rows] == (~due).tolist()
    np.testing.assert_allclose([float(r["grad_rms"]) for r in rows], grad_rms[:, -1], rtol=1e-5)

    for logdir in (tmp_path / "live", tensorboard):
        events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
        events.Reload()
        for column, name in enumerate(names):
            out = events.Scalars(f"gradscope/out_rms/{name}")
            assert [e.step for e in out] == np.flatnonzero(due).tolist()
            np.testing.assert_allclose([e.value for e in out], out_rms[due, column], rtol=1e-5)
            rms = events.Scalars(f"gradscope/grad_rms/{name}")
            np.testing.assert_allclose([e.value for e in rms], grad_rms[:, column], rtol=1e-5)
