"""Every sample model, run headless through the real engine, gets the diagnosis its docstring
and ``sample_models/README.md`` promise: phase, module, op and line of the first NaN/Inf, the
step range, and the status of the named layers at every step.

Each sample is run once per session (``_run``) and shared by the tests that read it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from gradscope.cli import main
from gradscope.core.history import RunHistory
from gradscope.core.origin import Origin
from gradscope.core.runner import StepResult, StepRunner
from gradscope.core.sources import load_with_settings
from gradscope.core.watch import (
    STATUS_EXPLODING,
    STATUS_NAMES,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_VANISHING,
)

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
SAMPLE_FILES = sorted(p.name for p in SAMPLES.glob("*.py") if not p.name.startswith("_"))


@dataclass
class SampleRun:
    path: Path
    runner: StepRunner
    results: list[StepResult]
    history: RunHistory
    layers: list[str]

    @property
    def origin(self) -> Origin | None:
        return self.runner.first_nonfinite

    def column(self, layer: str) -> int:
        return self.layers.index(layer)

    def grad_norms(self, layer: str) -> np.ndarray:
        index = self.column(layer)
        return np.array([r.stats.grad_norm[index] for r in self.results])

    def statuses(self, layer: str) -> list[str]:
        index = self.column(layer)
        return [STATUS_NAMES[int(r.stats.status[index])] for r in self.results]

    def first_step_with(self, layer: str, status: int) -> int | None:
        index = self.column(layer)
        return next((r.step for r in self.results if r.stats.status[index] == status), None)

    def line_of(self, text: str) -> int:
        """The 1-based line of the sample that contains ``text`` (exactly one must)."""
        lines = [i for i, line in enumerate(self.path.read_text().splitlines(), 1) if text in line]
        assert len(lines) == 1, f"{text!r} is on lines {lines} of {self.path.name}"
        return lines[0]


@contextlib.contextmanager
def _one_thread():
    # The samples are tiny: a second intra-op thread only adds synchronisation, and on a
    # busy machine spinning OpenMP threads make them many times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _execute(name: str, overrides: dict | None = None, **build_kwargs: object) -> SampleRun:
    with _one_thread():
        return _execute_here(name, overrides, build_kwargs)


def _execute_here(name: str, overrides: dict | None, build_kwargs: dict | None) -> SampleRun:
    path = SAMPLES / name
    loaded, settings = load_with_settings(str(path), overrides or {})
    if build_kwargs:
        loaded.build_model = functools.partial(loaded.build_model, **build_kwargs)
    runner = StepRunner(loaded, settings)
    assert runner.watch is not None
    layers = [layer.name for layer in runner.watch.layers]
    history = RunHistory()
    results = []
    try:
        for result in runner.run():
            results.append(result)
            history.append(
                result.step,
                result.loss,
                result.stats,
                layers,
                [layer.type_name for layer in runner.watch.layers],
                [layer.num_params for layer in runner.watch.layers],
                origin=result.origin,
            )
    finally:
        runner.close()
    return SampleRun(path, runner, results, history, layers)


@functools.cache
def _run(name: str) -> SampleRun:
    return _execute(name)


def _where(origin: Origin) -> tuple:
    return (origin.step, origin.phase, origin.module, origin.tensor, origin.kind)


def _assert_halted_at_origin(run: SampleRun) -> Origin:
    """The run stopped at the origin's step without applying that step's update, every
    earlier step was entirely finite, and the origin is the one of the last step."""
    origin = run.origin
    assert origin is not None, "expected a NaN/Inf, the run stayed finite"
    last = run.results[-1]
    assert last.step == origin.step and last.origin is origin
    assert run.runner.halted and not last.applied and last.nonfinite
    for result in run.results[:-1]:
        assert not result.nonfinite, f"step {result.step} is already non-finite"
        assert math.isfinite(result.loss)
        assert result.origin is None
    assert run.history.first_nonfinite is origin
    assert origin.file is not None and Path(origin.file).resolve() == run.path.resolve(), (
        f"the origin's line should point into {run.path.name}, not {origin.file}"
    )
    return origin


# -- every sample ---------------------------------------------------------------------------
def test_every_sample_is_documented_and_tested():
    readme = (SAMPLES / "README.md").read_text()
    assert len(SAMPLE_FILES) >= 8
    for name in SAMPLE_FILES:
        doc = (SAMPLES / name).read_text().split('"""')[1]
        assert "GradScope should report" in doc, f"{name}: docstring states no diagnosis"
        assert f"`{name}`" in readme, f"{name} has no row in sample_models/README.md"
        assert f"def test_{name.removesuffix('.py')}" in Path(__file__).read_text(), (
            f"{name} has no test of its own in {Path(__file__).name}"
        )


@pytest.mark.parametrize("name", SAMPLE_FILES)
def test_sample_runs_headless_and_deterministically(name):
    """Every sample loads and runs with its CONFIG; a second run reproduces the first exactly
    (same losses, same gradient norms, same origin)."""
    first = _run(name)
    assert first.results, f"{name} ran no step"
    again = _execute(name)
    assert [r.loss for r in again.results] == pytest.approx(
        [r.loss for r in first.results], nan_ok=True, rel=1e-6
    )
    for a, b in zip(again.results, first.results, strict=True):
        np.testing.assert_allclose(a.stats.grad_norm, b.stats.grad_norm, rtol=1e-5)
        np.testing.assert_array_equal(a.stats.status, b.stats.status)
    if first.origin is None:
        assert again.origin is None
    else:
        assert again.origin is not None
        assert _where(again.origin) == _where(first.origin)
        assert again.origin.op == first.origin.op and again.origin.line == first.origin.line


@pytest.mark.parametrize("name", SAMPLE_FILES)
def test_cli_json_gives_the_same_diagnosis(name, tmp_path, capsys):
    """``gradscope run SAMPLE --json``: the report's origin and layer statuses are the ones
    the engine gave in-process, and the printed summary names the same origin."""
    report_path = tmp_path / "report.json"
    with _one_thread():
        code = main(["run", str(SAMPLES / name), "--json", str(report_path)])
    assert code == 0
    out = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    run = _run(name)
    assert report["steps_run"] == len(run.results)
    assert [layer["name"] for layer in report["layers"]] == run.layers
    assert {layer["name"]: layer["status"] for layer in report["layers"]} == {
        layer: run.history.worst(layer) for layer in run.layers
    }
    if run.origin is None:
        assert report["first_nonfinite"] is None
        assert "first non-finite value" not in out
        return
    origin = report["first_nonfinite"]
    expected = run.origin
    assert (origin["step"], origin["phase"], origin["module"], origin["tensor"]) == (
        expected.step,
        expected.phase,
        expected.module,
        expected.tensor,
    )
    assert (origin["kind"], origin["op"], origin["line"]) == (
        expected.kind,
        expected.op,
        expected.line,
    )
    assert origin["hint"] == expected.details["hint"]
    if expected.file is not None:
        assert Path(origin["file"]).resolve() == (SAMPLES / name).resolve()
        assert origin["code"].strip() == expected.code.strip()
    assert f"first non-finite value: step {expected.step}:" in out


# -- one test per sample --------------------------------------------------------------------
def test_seed_explosion():
    run = _run("seed_explosion.py")
    assert run.origin is None
    assert len(run.results) == 10 and all(r.applied for r in run.results)
    assert run.layers == ["critical_layer", "output_layer"]
    for layer in run.layers:
        assert run.statuses(layer) == ["exploding"] * 10
        norms = run.grad_norms(layer)
        assert (norms > 1e9).all() and (norms < 1e13).all(), norms
    assert run.history.worst("critical_layer") == "exploding"
    # The weight gradient of critical_layer itself, not only the layer's total.
    weight = run.runner.watch.param_names.index("critical_layer.weight")
    assert all(r.stats.param_grad_norm[weight] > 1e9 for r in run.results)
    onsets = [(e.step, e.layer) for e in run.history.events if e.kind == "exploding"]
    assert onsets == [(0, "critical_layer"), (0, "output_layer")]


def test_vanishing_sigmoid_mlp():
    run = _run("vanishing_sigmoid_mlp.py")
    assert run.origin is None
    assert len(run.results) == 10
    depth_order = [f"hidden.{i}" for i in range(12)] + ["head"]
    assert run.layers == depth_order
    for result in run.results:
        assert not (result.stats.status == STATUS_EXPLODING).any()
        norms = result.stats.grad_norm
        # Each layer's gradient is smaller than the next one's, all the way down.
        assert (np.diff(norms) > 0).all(), f"step {result.step}: {norms}"
        assert norms[-1] / norms[0] > 1e8
    for layer in ("hidden.0", "hidden.1", "hidden.2", "hidden.3"):
        # Vanishing is a state: under the threshold for 3 consecutive steps.
        assert run.statuses(layer) == ["ok"] * 2 + ["vanishing"] * 8, layer
        assert (run.grad_norms(layer) < 1e-7).all()
    for layer in [f"hidden.{i}" for i in range(5, 12)] + ["head"]:
        assert run.statuses(layer) == ["ok"] * 10, layer
    assert run.history.worst("hidden.0") == "vanishing"
    assert run.history.worst("head") == "ok"
    vanishing_at_2 = {e.layer for e in run.history.events if e.kind == "vanishing" and e.step == 2}
    assert {"hidden.0", "hidden.1", "hidden.2", "hidden.3"} <= vanishing_at_2


def test_forward_log_of_zero():
    run = _run("forward_log_of_zero.py")
    origin = _assert_halted_at_origin(run)
    assert _where(origin) == (0, "forward", "frontend", "output", "inf")
    assert origin.op == "torch.log"
    assert origin.line == run.line_of("return torch.log(energy)")
    assert "torch.log(energy)" in origin.code
    # The built-in child's output is finite zeros: the custom module's own code is blamed.
    assert origin.module != "frontend.filterbank"
    # "input min 0.0 into log"
    log_input = origin.details["values"]["inputs"][0]
    assert log_input["min"] == 0.0 and log_input["nan"] == 0 and log_input["inf"] == 0
    assert "epsilon" in origin.details["hint"]
    assert run.statuses("frontend.filterbank") == ["nonfinite"]
    assert all(s == "nonfinite" for layer in run.layers for s in run.statuses(layer))
    assert math.isnan(run.results[0].loss)


def test_backward_sqrt_of_zero():
    run = _run("backward_sqrt_of_zero.py")
    origin = _assert_halted_at_origin(run)
    assert _where(origin) == (0, "backward", "distance", "input grad", "nan")
    assert origin.op is not None and origin.op.startswith("Tensor.sqrt")
    assert origin.line == run.line_of("return squared.sqrt()")
    assert "derivative" in origin.details["hint"] and "epsilon" in origin.details["hint"]
    # Forward and loss finite: only the gradient is not.
    step = run.results[0]
    assert math.isfinite(step.loss) and not step.stats.loss_nonfinite
    for layer in ("encoder.0", "encoder.2", "projection"):
        assert run.statuses(layer) == ["nonfinite"]
        assert run.results[0].stats.nan_count[run.column(layer)] > 0


def test_loss_log_softmax_underflow():
    run = _run("loss_log_softmax_underflow.py")
    origin = _assert_halted_at_origin(run)
    assert 5 <= origin.step <= 20, origin.step
    assert _where(origin)[1:] == ("loss", None, "loss", "inf")
    assert origin.op == "torch.log"
    assert origin.line == run.line_of("log_probs = torch.log(probs)")
    # The healthy steps before were really healthy, and the loss had been falling.
    for layer in run.layers:
        assert run.statuses(layer)[:-1] == ["ok"] * origin.step
        assert run.statuses(layer)[-1] == "nonfinite"
    losses = [r.loss for r in run.results]
    assert min(losses[:-1]) < 0.5 * losses[0]
    assert math.isnan(losses[-1]) and run.results[-1].stats.loss_nonfinite
    assert origin.details["values"]["inputs"][0]["min"] == 0.0  # softmax underflowed to 0
    assert "log_softmax" in origin.details["hint"]


def test_exploding_gru_long_sequences():
    run = _run("exploding_gru_long_sequences.py")
    origin = _assert_halted_at_origin(run)
    assert 12 <= origin.step <= 35, origin.step
    assert _where(origin)[1:] == ("loss", None, "loss", "inf")
    assert origin.op == "F.mse_loss"
    assert origin.line == run.line_of("return F.mse_loss(prediction, total)")

    onset = run.first_step_with("encoder.rnn", STATUS_EXPLODING)
    assert onset is not None and 3 <= onset <= 15, onset
    assert origin.step - onset >= 5, "the exploding warning should come well before the Inf"
    head_onset = run.first_step_with("head", STATUS_EXPLODING)
    assert head_onset is not None and onset <= head_onset < origin.step
    assert run.statuses("encoder.rnn")[:onset] == ["ok"] * onset
    rnn = run.grad_norms("encoder.rnn")
    assert rnn[0] < 10 and rnn[:-1].max() > 1e15 * rnn[0]
    assert run.grad_norms("head")[:-1].max() > 1e15
    # At the failing step the loss is Inf while the gradients are still finite.
    last = run.results[-1].stats
    assert last.loss_nonfinite and not (last.status == STATUS_NONFINITE).any()
    assert run.history.worst("encoder.rnn") == "exploding"


def test_exploding_gru_is_fixed_by_clipping():
    fixed = _execute("exploding_gru_long_sequences.py", {"clip": 1.0})
    assert fixed.origin is None
    assert len(fixed.results) == fixed.runner.settings.steps
    assert all(math.isfinite(r.loss) for r in fixed.results)


def test_exploding_gru_hint_says_the_loss_is_too_large_for_its_dtype():
    # An overflowing squared error is no exp: the max-subtraction advice would not apply.
    hint = _run("exploding_gru_long_sequences.py").origin.details["hint"]
    assert "too large for its dtype" in hint
    assert "logsumexp" not in hint


def test_default_loss_origin_does_not_point_into_the_caller():
    """With GradScope's own default loss no line of the user's made the Inf: the origin names
    none, rather than the first frame outside the engine (the CLI's or this test's loop)."""
    # The GRU sample with its loss_fn removed: GradScope's default MSE, the same numbers.
    path = SAMPLES / "exploding_gru_long_sequences.py"
    with _one_thread():
        loaded, settings = load_with_settings(str(path), {})
        loaded.loss_fn = None
        runner = StepRunner(loaded, settings)
        for _ in runner.run():
            pass
    origin = runner.first_nonfinite
    assert origin is not None and origin.phase == "loss" and origin.op == "F.mse_loss"
    assert origin.step == _run("exploding_gru_long_sequences.py").origin.step
    assert origin.file is None and origin.line is None, f"{origin.file}:{origin.line}"


def test_half_precision_attention_overflow():
    run = _run("half_precision_attention_overflow.py")
    assert all(p.dtype == torch.float16 for p in run.runner.model.parameters())
    origin = _assert_halted_at_origin(run)
    assert 10 <= origin.step <= 30, origin.step
    assert _where(origin)[1:] == ("forward", "encoder.attention", "output", "inf")
    assert origin.op == "Tensor.exp"
    assert origin.line == run.line_of("weights = scores.exp()")
    exp_input = origin.details["values"]["inputs"][0]
    assert exp_input["dtype"] == "float16" and exp_input["inf"] == 0 and exp_input["nan"] == 0
    # exp overflows float16 above 11.09; this input is far from float32's limit of 88.7.
    assert 11.08 < exp_input["max"] < 88
    assert "float16" in origin.details["hint"]
    for layer in run.layers:
        assert run.statuses(layer)[:-1] == ["ok"] * origin.step
        assert run.statuses(layer)[-1] == "nonfinite"
    losses = [r.loss for r in run.results[:-1]]
    assert min(losses) < 0.5 * losses[0]


def test_half_precision_sample_is_fine_in_float32():
    run32 = _execute("half_precision_attention_overflow.py", dtype=torch.float32)
    assert all(p.dtype == torch.float32 for p in run32.runner.model.parameters())
    assert run32.origin is None
    assert len(run32.results) == run32.runner.settings.steps
    assert not any(r.nonfinite for r in run32.results)


def test_masked_attention_empty_sequence():
    run = _run("masked_attention_empty_sequence.py")
    origin = _assert_halted_at_origin(run)
    assert _where(origin) == (0, "forward", "encoder.attention", "output", "nan")
    assert origin.op == "F.multi_head_attention_forward"
    assert origin.line == run.line_of("self.attention(x, x, x, key_padding_mask=padding)")
    assert "key_padding_mask" in origin.details["hint"]
    for layer in ("encoder.attention", "encoder.attention.out_proj", "head"):
        assert run.statuses(layer) == ["nonfinite"], layer
    # The NaN gradient reaches only the padding row of the embedding, which padding_idx drops.
    assert run.statuses("encoder.embed") == ["ok"]


def test_half_precision_adam_underflow():
    run = _run("half_precision_adam_underflow.py")
    assert len(run.results) == 2
    first, second = run.results
    assert first.applied and not first.nonfinite
    assert (first.stats.status == STATUS_OK).all()
    assert second.nonfinite and not second.applied and run.runner.halted
    # Found while running step 1, blamed on the update of step 0 that wrote the weights.
    origin = run.origin
    assert origin is not None and second.origin is origin and first.origin is None
    assert _where(origin) == (0, "update", "embedding", "weight", "nan")
    assert origin.op == "Adam.step"
    assert origin.file is None  # no line of the model's code made it
    assert "eps" in origin.details["hint"] and "float16" in origin.details["hint"]
    weight = run.runner.model.embedding.weight
    assert weight.dtype == torch.float16
    assert bool(weight.isinf().any()) and bool(weight.isnan().any())
    assert bool(run.runner.model.head.weight.isfinite().all())
    assert run.statuses("embedding") == ["ok", "nonfinite"]
    # Not the model's fault: the same steps in float32 stay finite.
    run32 = _execute("half_precision_adam_underflow.py", dtype=torch.float32)
    assert run32.origin is None and not any(r.nonfinite for r in run32.results)


def test_bad_data_missing_value():
    run = _run("bad_data_missing_value.py")
    origin = run.origin
    assert origin is not None
    assert 3 <= origin.step <= 40, origin.step
    assert _where(origin)[1:] == ("input", None, "inputs", "nan")
    # the data's fault: no op or line of the model is named
    assert origin.op is None and origin.file is None and origin.line is None
    assert origin.details["count"] == 1 and len(origin.details["samples"]) == 1
    (position,) = origin.details["positions"]
    sample, feature = position
    assert feature == 3  # lot_size
    last = run.results[-1]
    assert last.step == origin.step and last.origin is origin
    assert run.runner.halted and not last.applied
    assert all(not r.nonfinite for r in run.results[:-1])
    for layer in run.layers:
        assert run.statuses(layer)[-1] == "nonfinite"
    hint = origin.details["hint"]
    assert "filter or repair" in hint and "nan_to_num" in hint and "stopgap" in hint
    assert f"sample {sample}" in hint
    assert run.history.first_nonfinite is origin


def test_masked_lm_no_masked_token():
    run = _run("masked_lm_no_masked_token.py")
    origin = _assert_halted_at_origin(run)
    assert 3 <= origin.step <= 40, origin.step
    assert _where(origin)[1:] == ("forward", "", "output", "nan")
    assert origin.op == "F.cross_entropy"
    assert origin.line == run.line_of("loss = F.cross_entropy(")
    hint = origin.details["hint"]
    assert "ignore_index (-100)" in hint and "0/0" in hint
    assert "zeros under a log" not in hint
    # the logits were finite: only the 0/0 mean is not
    assert all(v["nan"] == 0 and v["inf"] == 0 for v in origin.details["values"]["inputs"])


def test_checkpointed_encoder_zero_norm():
    run = _run("checkpointed_encoder_zero_norm.py")
    origin = _assert_halted_at_origin(run)
    assert _where(origin) == (0, "backward", "encoder.normalize", "input grad", "nan")
    assert origin.op == "Tensor.sqrt backward (SqrtBackward0)"
    assert origin.line == run.line_of("length = x.pow(2).sum(dim=-1, keepdim=True).sqrt()")
    assert "infinite at 0" in origin.details["hint"]
    assert math.isfinite(run.results[0].loss)
    assert run.statuses("encoder.project") == ["nonfinite"]
    assert run.statuses("head") == ["ok"]
    # checkpointing changes nothing: the plain model and the reentrant form agree
    for build in ({"checkpointing": False}, {"reentrant": True}):
        other = _execute("checkpointed_encoder_zero_norm.py", **build).origin
        assert other is not None, build
        assert _where(other) == _where(origin), build
        assert (other.op, other.line) == (origin.op, origin.line), build


def test_custom_function_backward_nan():
    run = _run("custom_function_backward_nan.py")
    origin = _assert_halted_at_origin(run)
    assert _where(origin) == (0, "backward", "projector", "input grad", "inf")
    assert origin.op == "L2Normalize backward (L2NormalizeBackward)"
    assert origin.line == run.line_of("return L2Normalize.apply(self.lin(x))")
    assert "backward formula" in origin.details["hint"]
    assert math.isfinite(run.results[0].loss)
    assert run.statuses("projector.lin") == ["nonfinite"]
    assert run.statuses("head") == ["ok"]


def test_healthy_cnn():
    run = _run("healthy_cnn.py")
    assert run.origin is None
    assert len(run.results) == 20 and all(r.applied for r in run.results)
    convolutions = ["features.conv1", "features.bn1", "features.conv2", "features.bn2"]
    assert run.layers == [*convolutions, "classifier"]
    for result in run.results:
        assert (result.stats.status == STATUS_OK).all(), result.stats.status
        assert not result.stats.nonfinite
        assert ((result.stats.grad_norm > 1e-4) & (result.stats.grad_norm < 100)).all()
    assert all(run.history.worst(layer) == "ok" for layer in run.layers)
    assert run.history.events == []
    losses = [r.loss for r in run.results]
    assert np.mean(losses[-3:]) < 0.25 * np.mean(losses[:3])


def test_status_constants_are_what_the_tests_assume():
    assert STATUS_NAMES[STATUS_OK] == "ok"
    assert STATUS_NAMES[STATUS_VANISHING] == "vanishing"
    assert STATUS_NAMES[STATUS_EXPLODING] == "exploding"
    assert STATUS_NAMES[STATUS_NONFINITE] == "nonfinite"


# Mixed precision: run through `gradscope run` (the runner's --amp path), JSON checked.


def test_fp16_scaler_healthy_skips(tmp_path, capsys):
    report = tmp_path / "r.json"
    script = SAMPLES / "fp16_scaler_healthy_skips.py"
    code = main(["run", str(script), "--fail-on-nonfinite", "--json", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    data = json.loads(report.read_text())
    assert data["first_nonfinite"] is None
    assert data["skipped_steps"] == [0, 1, 2, 3, 4, 6, 7]
    assert data["loss_scale"][0] == 2.0**24 and data["loss_scale"][-1] == 2.0**17
    assert all(layer["status"] != "nonfinite" for layer in data["layers"])
    # The console's maxima leave out the skipped steps (their scaled gradients overflowed
    # and were never applied): finite figures, not NaN.
    table = out[out.index("max grad norm") :].splitlines()[2:5]
    assert len(table) == 3 and all("NaN" not in row and "Inf" not in row for row in table)


def test_fp16_scale_collapse_zero_norm(tmp_path, capsys):
    report = tmp_path / "r.json"
    script = SAMPLES / "fp16_scale_collapse_zero_norm.py"
    code = main(["run", str(script), "--fail-on-nonfinite", "--json", str(report)])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    origin = json.loads(report.read_text())["first_nonfinite"]
    assert (origin["step"], origin["phase"], origin["module"]) == (17, "backward", "pool")
    assert origin["op"].startswith("torch.sqrt backward")
    assert "torch.sqrt(" in origin["code"] and Path(origin["file"]).name == script.name
    assert "infinite at 0" in origin["hint"]
