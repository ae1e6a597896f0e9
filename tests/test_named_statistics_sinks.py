"""Named statistics (``StepStats.figures``) reach every sink by their name alone: the history,
the recording (and back), ``report --json``, CSV and TensorBoard.

The steps are a real watch's on a real model; their figures are computed here with plain
torch (the engine's ``gradscope.Statistic`` path fills the same field): ``grad_rms`` due
every step (a layer's largest parameter RMS), ``out_rms`` every second step (the RMS of
each watched module's output, from a forward hook) and ``grad_mean`` (a signed figure, to
show a negative value, -1 included, is a value and not a gap).
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.export.tensorboard_sink import TensorBoardSink
from gradscope.core.facts import StatisticInfo
from gradscope.core.history import MISSING, RunHistory
from gradscope.core.module_tree import build_module_tree
from gradscope.core.recording import FORMAT_VERSION, RecordingReader, RecordingWriter

STEPS = 6
INFOS = [
    StatisticInfo("grad_rms", "RMS of the gradient", "max", 1, "parameter"),
    StatisticInfo("out_rms", "", "rss", 2, "output"),
]


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4), nn.Tanh(), nn.Linear(4, 1))


def _run(history: RunHistory | None = None, sinks=()) -> tuple[list, list, dict]:
    """STEPS steps; returns (stats per step, watch.layers, {name: expected steps x layers})."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    watch = gradscope.watch(model, detail_every=1)
    modules = dict(model.named_modules())
    names = [layer.name for layer in watch.layers]
    outputs: dict[str, torch.Tensor] = {}
    hooks = [
        modules[name].register_forward_hook(
            lambda module, args, output, name=name: outputs.__setitem__(name, output.detach())
        )
        for name in names
    ]
    expected: dict[str, list] = {"grad_rms": [], "out_rms": [], "grad_mean": []}
    collected = []
    try:
        for step in range(STEPS):
            x, y = torch.randn(16, 5), torch.randn(16, 1)
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            stats = watch.collect(loss)
            rms = [
                max(float(p.grad.float().pow(2).mean().sqrt()) for p in modules[name].parameters())
                for name in names
            ]
            stats.figures["grad_rms"] = np.array(rms)
            expected["grad_rms"].append(rms)
            means = [float(modules[name].weight.grad.mean()) for name in names]
            means[0] = -1.0  # exactly MISSING's value: still a value
            stats.figures["grad_mean"] = np.array(means)
            expected["grad_mean"].append(means)
            if step % 2 == 0:
                out = [float(outputs[name].float().pow(2).mean().sqrt()) for name in names]
                stats.figures["out_rms"] = np.array(out)
                expected["out_rms"].append(out)
            else:
                expected["out_rms"].append([None] * len(names))
            if history is not None:
                history.append(step, loss.item(), stats, names)
            for sink in sinks:
                sink.write(stats, watch.layers)
            collected.append(stats)
            optimizer.step()
    finally:
        for hook in hooks:
            hook.remove()
        watch.close()
    return collected, watch.layers, expected


def _record(path, infos=INFOS):
    steps, layers, expected = _run()
    with RecordingWriter(path, build_module_tree(_model())) as writer:
        if infos is not None:
            writer.describe_statistics(infos)
        for stats in steps:
            writer.append(stats, layers)
    return layers, expected


def _close(actual: np.ndarray, expected: list, due: np.ndarray | None = None) -> None:
    rows = np.array([[np.nan if v is None else v for v in row] for row in expected])
    if due is not None:
        rows = rows[due]
        actual = actual[due]
    np.testing.assert_allclose(actual, rows.astype(np.float32), rtol=1e-6)


def test_history_keeps_named_figures_sparse_and_by_name():
    history = RunHistory()
    _, _, expected = _run(history)
    assert history.figure_names == ["grad_rms", "grad_mean", "out_rms"]
    due = history.figure_due("out_rms")
    assert due.tolist() == [step % 2 == 0 for step in range(STEPS)]
    assert history.figure_due("grad_rms").all()
    _close(history.matrix("out_rms"), expected["out_rms"], due)
    _close(history.matrix("grad_rms"), expected["grad_rms"])
    assert history.figure_measured("grad_mean")[:, 0].all()  # -1.0 measured, not a gap
    history.rewind_to(3)
    assert history.figure_due("out_rms").tolist() == [True, False, True]


def test_recording_round_trip_of_named_figures(tmp_path):
    path = tmp_path / "run.gsrec"
    layers, expected = _record(path)
    with RecordingReader(path) as reader:
        assert reader.format_version == FORMAT_VERSION == 3
        _, history = reader.load()
        infos = {info.name: info for info in reader.statistic_infos}
    assert infos["grad_rms"] == INFOS[0] and infos["out_rms"] == INFOS[1]
    assert history.statistic_info("grad_rms").shown_as == "RMS of the gradient"
    assert history.statistic_info("grad_mean").shown_as == "grad_mean"  # never described
    assert set(history.figure_names) == {"grad_rms", "out_rms", "grad_mean"}
    due = history.figure_due("out_rms")
    assert due.tolist() == [step % 2 == 0 for step in range(STEPS)]
    _close(history.matrix("out_rms"), expected["out_rms"], due)
    _close(history.matrix("grad_rms"), expected["grad_rms"])
    _close(history.matrix("grad_mean"), expected["grad_mean"])
    # A decimated read keeps each chosen step's figures.
    with RecordingReader(path) as reader:
        _, decimated = reader.load(max_rows=3)
    kept = decimated.steps
    assert len(kept) < STEPS
    _close(decimated.matrix("grad_rms"), [expected["grad_rms"][s] for s in kept])
    assert decimated.figure_due("out_rms").tolist() == [s % 2 == 0 for s in kept.tolist()]
    # One layer's named statistic alone, read lazily (MISSING where it was not due).
    with RecordingReader(path) as reader:
        steps, values = reader.read_statistic("out_rms", layers[1].name)
    assert steps.tolist() == list(range(STEPS))
    _close(values[::2, None], [row[1:2] for row in expected["out_rms"][::2]])
    assert (values[1::2] == MISSING).all()


def test_follow_mode_and_rewind_carry_named_figures(tmp_path):
    path = tmp_path / "run.gsrec"
    steps, layers, expected = _run()
    writer = RecordingWriter(path, build_module_tree(_model()))
    try:
        writer.describe_statistics(INFOS)
        for stats in steps[:2]:
            writer.append(stats, layers)
        writer.flush()
        with RecordingReader(path) as reader:
            _, history = reader.load()
            assert history.figure_due("out_rms").tolist() == [True, False]
            for stats in steps[2:]:
                writer.append(stats, layers)
            writer.flush()
            assert reader.read_new_steps(history) == STEPS - 2
            _close(history.matrix("out_rms"), expected["out_rms"], history.figure_due("out_rms"))
            writer.rewind_to(2)
            writer.append(steps[2], layers)
            writer.flush()
            reader.read_new_steps(history)
            assert history.steps.tolist() == [0, 1, 2]
            assert history.figure_due("out_rms").tolist() == [True, False, True]
    finally:
        writer.close()
    with RecordingReader(path) as reader:
        _, history = reader.load()
    assert history.figure_due("grad_rms").tolist() == [True, True, True]


def test_report_json_and_csv_hold_named_figures_null_when_not_due(tmp_path):
    path = tmp_path / "run.gsrec"
    layers, expected = _record(path)
    report_path, csv_path = tmp_path / "report.json", tmp_path / "steps.csv"
    assert main(["report", str(path), "--json", str(report_path), "--csv", str(csv_path)]) == 0
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert [s["name"] for s in report["statistics"]] == report_statistics_order(path)
    described = {s["name"]: s for s in report["statistics"]}
    assert described["grad_rms"]["label"] == "RMS of the gradient"
    assert described["out_rms"]["every"] == 2
    for column, layer in enumerate(report["layers"]):
        out = layer["out_rms"]
        assert out[1::2] == [None] * (STEPS // 2)
        np.testing.assert_allclose(
            out[::2], [expected["out_rms"][s][column] for s in range(0, STEPS, 2)], rtol=1e-6
        )
        np.testing.assert_allclose(
            layer["grad_rms"], [row[column] for row in expected["grad_rms"]], rtol=1e-6
        )
    assert report["layers"][0]["grad_mean"] == [-1.0] * STEPS
    with open(csv_path, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0])[-3:] == report_statistics_order(path)
    first = [row for row in rows if row["layer"] == layers[0].name]
    assert [row["out_rms"] == "" for row in first] == [s % 2 == 1 for s in range(STEPS)]
    assert float(first[2]["out_rms"]) == pytest.approx(expected["out_rms"][2][0], rel=1e-6)
    assert [row["grad_mean"] for row in first] == ["-1"] * STEPS


def report_statistics_order(path) -> list[str]:
    with RecordingReader(path) as reader:
        _, history = reader.load()
    return history.figure_names


def _tensorboard(logdir) -> EventAccumulator:
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return events


def test_tensorboard_live_and_from_the_recording_tag_named_figures(tmp_path):
    live = TensorBoardSink(tmp_path / "live")
    try:
        steps, layers, expected = _run(sinks=[live])
    finally:
        live.close()
    path = tmp_path / "run.gsrec"
    with RecordingWriter(path, build_module_tree(_model())) as writer:
        writer.describe_statistics(INFOS)
        for stats in steps:
            writer.append(stats, layers)
    assert main(["report", str(path), "--tensorboard", str(tmp_path / "report")]) == 0
    for logdir in ("live", "report"):
        events = _tensorboard(tmp_path / logdir)
        for column, layer in enumerate(layers):
            out = events.Scalars(f"gradscope/out_rms/{layer.name}")
            assert [e.step for e in out] == list(range(0, STEPS, 2))
            np.testing.assert_allclose(
                [e.value for e in out],
                [expected["out_rms"][s][column] for s in range(0, STEPS, 2)],
                rtol=1e-6,
            )
            rms = events.Scalars(f"gradscope/grad_rms/{layer.name}")
            assert [e.step for e in rms] == list(range(STEPS))
        mean = events.Scalars(f"gradscope/grad_mean/{layers[0].name}")
        assert [e.value for e in mean] == [-1.0] * STEPS


def test_recording_without_descriptions_keeps_names(tmp_path):
    path = tmp_path / "run.gsrec"
    _record(path, infos=None)
    with RecordingReader(path) as reader:
        _, history = reader.load()
        assert reader.statistic_infos == []
    assert history.statistic_info("out_rms").shown_as == "out_rms"
    assert history.figure_due("out_rms").tolist() == [s % 2 == 0 for s in range(STEPS)]


def test_a_damaged_named_statistic_is_one_clear_message(tmp_path):
    import sqlite3

    from gradscope.core.errors import GradScopeError

    for damage, said in (
        ("DROP TABLE figures", "lacks the tables figures"),
        ("UPDATE figures SET data = 'text' WHERE row = 1", "grad_rms values is text"),
        ("UPDATE figures SET statistic = 7 WHERE row = 2 AND statistic = 0", "does not describe"),
    ):
        path = tmp_path / f"run{len(said)}.gsrec"
        _record(path)
        with sqlite3.connect(path) as connection:
            connection.execute(damage)
        with pytest.raises(GradScopeError, match="is damaged") as raised:
            with RecordingReader(path) as reader:
                reader.load()
        assert said in str(raised.value)
