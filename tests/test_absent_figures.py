"""A statistic that does not apply to a layer (it returns None there) leaves that layer
absent, never a made-up value: NaN and ``StepStats.absent`` in the step, MISSING (a gap) and
not measured in the history, absent in the recording and back, null in ``report --json``,
an empty CSV cell, no TensorBoard point (live and converted). The output head's
log-partition is absent at every layer but the head once the head is known.

``tests/data/absent_figures.gsrec`` was written by this GradScope with
``models.absent_statistics.train(path)`` (4 steps), and its ``report --json`` beside it
(``absent_figures.report.json``); the reader must keep opening it with the same absent cells.

``tests/data/v3_recording.gsrec`` (with its ``report --json`` and ``--csv`` beside it) was
written and reported by GradScope at c1775fa, before absent figures (format 3 without the
``absent_figures`` table): a Linear(4,6)-Tanh-Linear(6,3)-Tanh-Linear(3,5) classifier (seed
0), SGD lr 0.1, ``gradscope.watch(model, statistics=[GradRMS(), OutRMS()], record=...,
detail_every=2, early_warnings=True)``, 6 steps of cross-entropy on ``torch.randn(8, 4)``
against ``torch.randint(0, 5, (8,))``. Its head log-partition holds the 0 that GradScope
then wrote for the non-head layers: an older recording reports exactly as it did.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from models.absent_statistics import LAYERS, STEPS, LinearOut, WeightRMS, make_model, train
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.history import MISSING, RunHistory
from gradscope.core.recording import RecordingReader

DATA = Path(__file__).parent / "data"
DUE = np.arange(STEPS) % LinearOut.every == 0


def _as_array(rows: list[list[float | None]]) -> np.ndarray:
    return np.array([[math.nan if v is None else v for v in row] for row in rows])


def test_none_makes_a_layer_absent_in_stepstats_and_a_partial_layer_uses_the_rest():
    all_stats, rms, out = train()
    for stats, expected_rms, expected_out in zip(all_stats, rms, out, strict=True):
        values = stats.figures["weight_grad_rms"]
        # The LayerNorm (vectors only) is absent; each Linear's mean is its weight's alone
        # (a bias counted as 0 would halve it).
        assert stats.absent["weight_grad_rms"].tolist() == [False, True, False]
        assert math.isnan(values[1])
        np.testing.assert_allclose(values[[0, 2]], [expected_rms[0], expected_rms[2]], rtol=1e-5)
        if stats.step % LinearOut.every == 0:
            assert stats.absent["linear_out_max"].tolist() == [False, True, False]
            found = stats.figures["linear_out_max"]
            assert math.isnan(found[1])
            np.testing.assert_allclose(found[[0, 2]], [expected_out[0], expected_out[2]])
        else:  # not due: neither figures nor an absent mask
            assert "linear_out_max" not in stats.figures
            assert "linear_out_max" not in stats.absent


def test_none_is_not_garbage_and_a_string_still_is():
    class Sometimes(gradscope.Statistic):
        name = "sometimes"
        every = 1

        def parameter(self, grad, weight):
            return None if grad.dim() == 1 else grad.abs().sum()

    class Garbage(gradscope.Statistic):
        name = "garbage"
        every = 1

        def parameter(self, grad, weight):
            return "not a value"

    model = make_model()
    with pytest.warns(UserWarning, match="'garbage'") as caught:
        with gradscope.watch(model, statistics=[Sometimes(), Garbage()]) as watch:
            for _ in range(2):
                model(torch.randn(4, 5)).sum().backward()
                stats = watch.collect()
                model.zero_grad()
    assert not any("sometimes" in str(w.message) for w in caught)
    assert "garbage" not in stats.figures
    assert stats.absent["sometimes"].tolist() == [False, True, False]


def test_a_real_nan_is_not_absent():
    class NanForVectors(gradscope.Statistic):
        name = "nan_for_vectors"
        every = 1
        combine = "max"

        def parameter(self, grad, weight):
            value = grad.abs().amax()
            return value * math.nan if grad.dim() == 1 else value

    model = make_model()
    with gradscope.watch(model, statistics=[NanForVectors()]) as watch:
        model(torch.randn(4, 5)).sum().backward()
        stats = watch.collect()
    assert np.isnan(stats.figures["nan_for_vectors"]).all()  # max with a NaN bias: NaN
    assert "nan_for_vectors" not in stats.absent
    history = RunHistory()
    history.append(0, 0.0, stats, LAYERS)
    assert history.figure_measured("nan_for_vectors").all()
    assert np.isnan(history.matrix("nan_for_vectors")).all()


def test_the_history_shows_absent_as_missing_not_zero():
    all_stats, rms, _ = train()
    history = RunHistory()
    for stats in all_stats:
        history.append(stats.step, stats.loss, stats, LAYERS)
    matrix = history.matrix("weight_grad_rms")
    assert (matrix[:, 1] == MISSING).all()
    np.testing.assert_allclose(matrix[:, [0, 2]], _as_array(rms)[:, [0, 2]], rtol=1e-5)
    measured = history.figure_measured("weight_grad_rms")
    assert measured[:, [0, 2]].all() and not measured[:, 1].any()
    outputs = history.figure_measured("linear_out_max")
    assert outputs[:, 0].tolist() == DUE.tolist() and not outputs[:, 1].any()
    # A rewind forgets the absent cells with the rows.
    history.rewind_to(1)
    assert history.figure_absent("weight_grad_rms").shape == (1, 3)


def _check_report_and_csv(path: Path, tmp_path: Path, rms, out) -> None:
    report, table = tmp_path / "report.json", tmp_path / "steps.csv"
    tensorboard = tmp_path / "converted"
    args = ["report", str(path), "--json", str(report), "--csv", str(table)]
    assert main([*args, "--tensorboard", str(tensorboard)]) == 0
    layers = {entry["name"]: entry for entry in json.loads(report.read_text())["layers"]}
    assert layers["1"]["weight_grad_rms"] == [None] * STEPS
    assert layers["1"]["linear_out_max"] == [None] * STEPS
    for column in (0, 2):
        entry = layers[LAYERS[column]]
        np.testing.assert_allclose(entry["weight_grad_rms"], _as_array(rms)[:, column], rtol=1e-5)
        assert [v is None for v in entry["linear_out_max"]] == (~DUE).tolist()
        np.testing.assert_allclose(
            [v for v in entry["linear_out_max"] if v is not None],
            _as_array(out)[DUE, column],
            rtol=1e-5,
        )
    with open(table, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    norm_rows = [row for row in rows if row["layer"] == "1"]
    assert len(norm_rows) == STEPS
    assert all(row["weight_grad_rms"] == "" and row["linear_out_max"] == "" for row in norm_rows)
    assert all(row["grad_norm"] != "" for row in norm_rows)  # the layer itself was watched
    first = [row for row in rows if row["layer"] == "0"]
    assert all(row["weight_grad_rms"] != "" for row in first)
    return tensorboard


def _check_tensorboard(logdir: Path, rms) -> None:
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert "gradscope/grad_norm/1" in tags  # the layer is there, only not these figures
    assert "gradscope/weight_grad_rms/1" not in tags
    assert "gradscope/linear_out_max/1" not in tags
    found = events.Scalars("gradscope/weight_grad_rms/0")
    assert [e.step for e in found] == list(range(STEPS))
    np.testing.assert_allclose([e.value for e in found], _as_array(rms)[:, 0], rtol=1e-5)
    assert [e.step for e in events.Scalars("gradscope/linear_out_max/3")] == np.flatnonzero(
        DUE
    ).tolist()


def test_absent_figures_through_the_recording_report_csv_and_tensorboard(tmp_path):
    path = tmp_path / "run.gsrec"
    _, rms, out = train(path, tensorboard=tmp_path / "live")
    with RecordingReader(path) as reader:
        _, history = reader.load()
    assert (history.matrix("weight_grad_rms")[:, 1] == MISSING).all()
    assert history.figure_absent("weight_grad_rms")[:, 1].all()
    assert not history.figure_absent("weight_grad_rms")[:, [0, 2]].any()
    assert history.figure_absent("linear_out_max")[:, 1].tolist() == DUE.tolist()
    converted = _check_report_and_csv(path, tmp_path, rms, out)
    _check_tensorboard(tmp_path / "live", rms)
    _check_tensorboard(converted, rms)


def test_a_decimated_load_keeps_the_absent_cells(tmp_path):
    path = tmp_path / "run.gsrec"
    train(path, steps=12)
    with RecordingReader(path) as reader:
        _, history = reader.load(max_rows=4)
    assert history.count < 12
    assert history.figure_absent("weight_grad_rms")[:, 1].all()
    assert not history.figure_measured("weight_grad_rms")[:, 1].any()
    assert history.figure_measured("weight_grad_rms")[:, 0].all()


@pytest.fixture
def committed(tmp_path) -> Path:
    """A copy: a reader of a WAL-mode file makes its -shm and -wal beside it."""
    copy = tmp_path / "absent_figures.gsrec"
    shutil.copyfile(DATA / "absent_figures.gsrec", copy)
    return copy


def test_the_committed_recording_with_absent_figures_keeps_opening(committed, tmp_path):
    with RecordingReader(committed) as reader:
        assert reader.format_version == 3
        _, history = reader.load()
    assert history.count == STEPS and history.layer_names == LAYERS
    assert history.figure_absent("weight_grad_rms")[:, 1].all()
    assert history.figure_absent("linear_out_max")[:, 1].tolist() == DUE.tolist()
    report = tmp_path / "report.json"
    assert main(["report", str(committed), "--json", str(report)]) == 0
    expected = json.loads((DATA / "absent_figures.report.json").read_text(encoding="utf-8"))
    found = json.loads(report.read_text(encoding="utf-8"))
    assert found["layers"] == expected["layers"]
    assert found["statistics"] == expected["statistics"]


def test_the_log_partition_is_absent_but_at_the_head():
    torch.manual_seed(0)
    vocabulary = 11
    model = nn.Sequential(
        nn.Embedding(vocabulary, 8), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, vocabulary)
    )
    tokens = torch.randint(0, vocabulary, (4, 6))
    with gradscope.watch(model, early_warnings=True, detail_every=1) as watch:
        names = [layer.name for layer in watch.layers]
        assert names == ["0", "1", "3"]
        found = []
        for _ in range(3):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, vocabulary), tokens[:, 1:].reshape(-1)
            )
            loss.backward()
            found.append(watch.collect(loss))
            model.zero_grad()
    with torch.no_grad():
        hidden = model[2](model[1](model[0](tokens[:, :-1])))
        head = float(torch.logsumexp(model[3](hidden), -1).max())
        inner = float(torch.logsumexp(model[1](model[0](tokens[:, :-1])), -1).max())
    # The first step measures every Linear to find the head: real figures, kept. The
    # embedding is not a Linear: absent from the start.
    first = found[0]
    assert first.absent["out_log_partition"].tolist() == [True, False, False]
    assert math.isnan(first.figures["out_log_partition"][0])
    for stats in found[1:]:
        assert stats.absent["out_log_partition"].tolist() == [True, True, False]
        values = stats.figures["out_log_partition"]
        assert np.isnan(values[:2]).all()
    # No optimizer step: the weights are those of every step.
    assert found[-1].figures["out_log_partition"][2] == pytest.approx(head, rel=1e-5)
    assert first.figures["out_log_partition"][1] == pytest.approx(inner, rel=1e-5)


def test_a_format_3_recording_from_before_absent_figures_reports_as_it_did(tmp_path):
    copy = tmp_path / "v3_recording.gsrec"
    shutil.copyfile(DATA / "v3_recording.gsrec", copy)
    with RecordingReader(copy) as reader:
        assert reader.format_version == 3
        _, history = reader.load()
    assert all(history.figure_absent(name) is None for name in history.figure_names)
    report, table = tmp_path / "report.json", tmp_path / "steps.csv"
    assert main(["report", str(copy), "--json", str(report), "--csv", str(table)]) == 0
    expected = json.loads((DATA / "v3_recording.report.json").read_text(encoding="utf-8"))
    assert json.loads(report.read_text(encoding="utf-8")) == expected
    assert table.read_text(encoding="utf-8") == (DATA / "v3_recording.csv").read_text(
        encoding="utf-8"
    )


def test_none_in_a_stacked_group_of_small_tensors():
    # 20 blocks: the 60 vectors of shape (4,) are read as one stacked batch, the 20
    # matrices by the fused call; the statistic applies to the matrices only.
    torch.manual_seed(0)
    blocks = []
    for _ in range(20):
        blocks += [nn.Linear(4, 4), nn.LayerNorm(4)]
    model = nn.Sequential(*blocks)
    with gradscope.watch(model, statistics=[WeightRMS()]) as watch:
        assert any(g.stacked for g in watch.binding.groups)
        model(torch.randn(3, 4)).pow(2).sum().backward()
        stats = watch.collect()
        names = [layer.name for layer in watch.layers]
    modules = dict(model.named_modules())
    norms = np.array([isinstance(modules[n], nn.LayerNorm) for n in names])
    assert stats.absent["weight_grad_rms"].tolist() == norms.tolist()
    values = stats.figures["weight_grad_rms"]
    assert np.isnan(values[norms]).all()
    expected = [float(modules[n].weight.grad.pow(2).mean().sqrt()) for n in np.array(names)[~norms]]
    np.testing.assert_allclose(values[~norms], expected, rtol=1e-5)
