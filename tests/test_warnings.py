"""Early warnings (#37): the detectors on series, and the drift cases through the real watch:
each failing case warns at least 20 steps before its failure, naming the module where the
precursor is; no look-alike and no healthy sample warns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.facts import EARLY_WARNING_KINDS
from gradscope.core.runner import StepRunner
from gradscope.core.sources import load_with_settings
from gradscope.core.warnings import EarlyWarnings, Observation, drift, limits, spike
from gradscope.core.warnings.monitor import EXPONENT, MAGNITUDE, LayerObservations
from tests.models.drift_cases import CASES, LOOK_ALIKES, run_watched

LEAD = 20  # steps a warning must come before the failure
SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"


def _feed(
    monitor: EarlyWarnings,
    values,
    module="blocks.1.attn",
    quantity="output max |x|",
    dtype=torch.float16,
    scale="magnitude",
    start=0,
):
    for step, value in enumerate(values, start):
        monitor.observe(step, [Observation(module, quantity, float(value), dtype, scale)])
    return monitor.warnings


def test_limits_of_the_dtypes():
    assert limits.overflow(torch.float16) == 65504.0
    assert limits.smallest_normal(torch.float16) == pytest.approx(6.1035e-05, rel=1e-4)
    assert limits.exp_overflow(torch.float16) == pytest.approx(11.0898, abs=1e-4)
    assert limits.exp_overflow(torch.float32) == pytest.approx(88.7228, abs=1e-4)
    assert limits.exp_overflow(torch.bfloat16) == pytest.approx(88.72, abs=0.01)
    # exp really overflows there: float16 exp(11.08) is finite, exp(11.1) is not
    assert torch.isfinite(torch.tensor(11.08, dtype=torch.float16).exp())
    assert torch.isinf(torch.tensor(11.1, dtype=torch.float16).exp())


def test_spike_against_the_running_median():
    rng = np.random.default_rng(0)
    quiet = np.log(1.0 + 0.05 * rng.standard_normal(40))
    assert spike.find_spike(quiet, math.log(1.05)) is None
    found = spike.find_spike(quiet, math.log(3.0))
    assert found is not None and found.z > spike.THRESHOLD
    # too little history says nothing
    assert spike.find_spike(quiet[: spike.MIN_HISTORY - 1], math.log(30.0)) is None


def test_a_loss_spike_after_a_quiet_stretch_warns_once_with_its_evidence():
    rng = np.random.default_rng(1)
    losses = [*(2.0 + 0.05 * rng.standard_normal(60)), 9.0, 9.5]
    monitor = EarlyWarnings()
    warned = _feed(monitor, losses, module=None, quantity="loss", dtype=None)
    assert [(w.step, w.kind, w.module, w.quantity) for w in warned] == [
        (60, "spiking", None, "loss")
    ]
    assert "its running median 2" in warned[0].evidence
    assert warned[0].value == 9.0


def test_drift_projects_the_steps_to_the_float16_overflow():
    # grows 8% a step: doubling every 9 steps
    values = [50.0 * 1.08**step for step in range(80)]
    warned = _feed(EarlyWarnings(), values)
    assert [w.kind for w in warned] == ["drifting", "low headroom"]  # headroom at 16,376
    warning = warned[0]
    assert warning.kind == "drifting" and warning.module == "blocks.1.attn"
    assert warning.limit == 65504.0
    # at step s the value is 50 * 1.08**s; it reaches 65504 at s = 93.3
    expected = math.log(65504 / 50) / math.log(1.08) - warning.step
    assert warning.steps_left == pytest.approx(expected, abs=2)
    assert "doubling every 9 steps" in warning.evidence
    assert "float16 overflows at" in warning.evidence and "at this rate in ~" in warning.evidence


def test_early_growth_that_flattens_and_a_return_to_an_old_high_do_not_drift():
    # the usual early rise of training, then a plateau
    flattening = [5.0 * (1 + 20 * (1 - math.exp(-step / 6))) for step in range(200)]
    assert _feed(EarlyWarnings(), flattening, dtype=torch.float32) == []
    # falls from 3 to 0.08, then climbs 4-fold: never beyond where it started
    back = [3.0 * 0.95**step for step in range(72)]
    back += [back[-1] * 1.07**step for step in range(1, 25)]
    assert _feed(EarlyWarnings(), back, dtype=torch.float32) == []


def test_drift_of_an_exp_input_counts_only_towards_its_limit():
    rising = [4.0 + 0.1 * step for step in range(70)]  # +0.1 a step
    assert _feed(EarlyWarnings(), rising, dtype=torch.float32, scale=EXPONENT) == []
    warned = _feed(EarlyWarnings(), rising, dtype=torch.float16, scale=EXPONENT)
    assert warned[0].kind == "drifting"
    # 4 + 0.1 s reaches 11.09 at s = 70.9
    assert warned[0].steps_left == pytest.approx(70.9 - warned[0].step, abs=2)
    assert "float16 exp overflows at 11.09" in warned[0].evidence


def test_low_headroom_to_overflow_and_to_the_smallest_normal():
    monitor = EarlyWarnings()
    new = monitor.observe(
        3,
        [
            Observation("a", "output max |x|", 20000.0, torch.float16),
            Observation("b", "output max |x|", 1000.0, torch.float16),
            Observation("c", "output max |x|", 1e6, torch.float32),
            Observation("d", "output max |x|", 1e-4, torch.float16),
            Observation("e", "output max |x|", 20000.0, torch.bfloat16),
            Observation("f", "log-partition", 10.0, torch.float16, EXPONENT),
            Observation("g", "log-partition", 10.0, torch.float32, EXPONENT),
            Observation("h", "output max |x|", 0.0, torch.float16),  # all zero: not underflow
        ],
    )
    assert {(w.module, w.kind) for w in new} == {
        ("a", "low headroom"),
        ("d", "low headroom"),
        ("f", "low headroom"),
    }
    by_module = {w.module: w for w in new}
    assert "1.09 below the point where float16 exp overflows" in by_module["f"].evidence
    (over,) = EarlyWarnings().observe(
        0, [Observation("z", "log-partition", 90.63, torch.float32, EXPONENT)]
    )
    assert "90.63, 1.91 above the point where float32 exp overflows at 88.72" in over.evidence
    assert by_module["a"].limit == 65504.0
    assert by_module["d"].limit == limits.smallest_normal(torch.float16)
    assert by_module["f"].limit == pytest.approx(11.09, abs=0.01)


def _swinging(monitor, values, dtype=torch.float16, scale=EXPONENT, quantity="exp input max"):
    """Each value as a scalar observation and as a one-layer vector; the steps where each warns."""
    vector = EarlyWarnings()
    for step, value in enumerate(values):
        monitor.observe(step, [Observation("m", quantity, value, dtype, scale)])
        layers = LayerObservations(("m",), quantity, np.array([value]), (dtype,), scale)
        vector.observe(step, [layers])
    assert vector.warnings == monitor.warnings
    return [(w.step, w.kind) for w in monitor.warnings]


def test_low_headroom_when_two_of_its_recent_rises_cross_the_limit():
    # float16 exp overflows at 11.09: 7.6 is 3.5 below, beyond the fixed margin (ln 4)
    calm = [7.0, 7.3, 7.1, 7.4, 7.2, 7.5, 7.3, 7.6, 7.4, 7.6]  # rises of 0.3 at most
    assert _swinging(EarlyWarnings(), calm) == []
    swinging = [5.8, 6.0, 5.1, 4.4, 5.3, 5.8, 6.0, 6.1, 5.2, 7.0, 6.6, 7.6]  # 1.8 at step 9
    monitor = EarlyWarnings()
    assert _swinging(monitor, swinging) == [(11, "low headroom")]
    assert monitor.warnings[0].evidence.endswith(
        "rose by up to 1.80 between two of its recent samples, and twice that crosses it"
    )
    # too few samples to know its swings; in float32 (88.7) the same swings are far off
    assert _swinging(EarlyWarnings(), swinging[5:]) == []
    assert _swinging(EarlyWarnings(), swinging, dtype=torch.float32) == []
    # not magnitudes: a healthy float16 output may grow 10-30x a step from its initial values
    grown = [0.5, 0.6, 0.5, 0.7, 0.6, 0.8, 0.7, 10.0, 150.0, 1200.0]
    assert _swinging(EarlyWarnings(), grown, scale=MAGNITUDE, quantity="q") == []


def test_one_warning_per_module_and_kind_and_non_finite_values_ignored():
    monitor = EarlyWarnings()
    for step in range(5):
        monitor.observe(step, [Observation("a", "output max |x|", 30000.0, torch.float16)])
    monitor.observe(5, [Observation("a", "output max |x|", math.inf, torch.float16)])
    assert [(w.step, w.kind) for w in monitor.warnings] == [(0, "low headroom")]
    assert all(w.kind in EARLY_WARNING_KINDS for w in monitor.warnings)


def test_drift_needs_its_window_and_baseline():
    growing = [10.0 * 1.2**step for step in range(drift.WINDOW + drift.BASELINE - 1)]
    assert _feed(EarlyWarnings(), growing, dtype=torch.float32) == []


# -- through the watch ---------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_each_drift_case_warns_ahead_of_its_failure_naming_the_precursor(case):
    run, watch = run_watched(case, detail_every=1, early_warnings=True)
    assert run.failed_at is not None and 60 <= run.failed_at <= 400, run.failed_at
    warnings = watch.early_warnings.warnings
    assert warnings, f"{case.name} failed at step {run.failed_at} without a warning"
    first = warnings[0]
    assert first.step <= run.failed_at - LEAD, (first.describe(), run.failed_at)
    assert first.module in case.precursors, first.describe()
    assert first.evidence.startswith(first.module)
    assert HINTED[case.name] in first.hint, first.hint


# What the first warning's hint must name for each case: the fix its look-alike applies.
HINTED = {
    "attention_logit_growth": "qk-layernorm",
    "lm_head_log_partition": "z-loss",
    "half_residual_stream": "float32",
    "warmup_too_high": "warm-up",
}


@pytest.mark.parametrize("case", LOOK_ALIKES, ids=lambda case: case.name)
def test_no_look_alike_warns(case):
    run, watch = run_watched(case, detail_every=1, early_warnings=True)
    assert run.failed_at is None
    assert [w.describe() for w in watch.early_warnings.warnings] == []


def test_the_warnings_reach_stats_and_the_statistics_are_hooked_only_when_asked():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with gradscope.watch(model) as plain:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        stats = plain.collect(loss)
        assert stats.warnings == [] and "out_max_abs" not in stats.figures
        assert all(not m._forward_hooks for m in model.modules())
    with gradscope.watch(model, early_warnings=True, detail_every=1) as watch:
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            stats = watch.collect(loss)
        assert stats.figures["out_max_abs"][0] == pytest.approx(
            model[0](x).abs().max().item(), rel=1e-6
        )
        # the head is the Linear called last: its log-partition; the others are absent
        # (not applicable: NaN and marked, never a made-up 0)
        head = torch.logsumexp(model(x), -1).max().item()
        partitions = stats.figures["out_log_partition"]
        assert math.isnan(partitions[0]) and partitions[1] == pytest.approx(head)
        assert stats.absent["out_log_partition"].tolist() == [True, False]
    # A float16 output close to its overflow warns at the step it is seen.
    half = nn.Linear(4, 4).half()
    with torch.no_grad():
        half.weight.fill_(1000.0)
    with gradscope.watch(half, early_warnings=True, detail_every=1) as watch:
        out = half(torch.full((2, 4), 5.0, dtype=torch.float16))
        loss = out.float().mean()
        loss.backward()
        stats = watch.collect(loss)
    assert [(w.module, w.kind, w.quantity) for w in stats.warnings] == [
        ("", "low headroom", "output max |x|")
    ]


@pytest.mark.parametrize("sample", ["healthy_cnn.py", "fp16_scaler_healthy_skips.py"])
def test_healthy_samples_do_not_warn(sample):
    torch.set_num_threads(1)
    loaded, settings = load_with_settings(str(SAMPLES / sample), {"steps": 80})
    settings.early_warnings = True
    runner = StepRunner(loaded, settings)
    try:
        results = list(runner.run())
    finally:
        runner.close()
    assert len(results) == 80
    assert [w.describe() for w in runner.watch.early_warnings.warnings] == []


# The one sample that announces its failure: its float16 exp input swings towards the
# overflow (issue #37's own example; tests/test_op_reader.py checks that it warns ahead).
_WARNS_AHEAD = {"half_precision_attention_overflow.py"}


@pytest.mark.parametrize(
    "sample", sorted(p.name for p in SAMPLES.glob("*.py") if p.name not in _WARNS_AHEAD)
)
def test_no_sample_model_warns(sample):
    torch.set_num_threads(1)
    loaded, settings = load_with_settings(str(SAMPLES / sample), {})
    settings.early_warnings = True
    runner = StepRunner(loaded, settings)
    try:
        for _ in runner.run():
            pass
    finally:
        runner.close()
    assert [w.describe() for w in runner.watch.early_warnings.warnings] == []


_DRIFTING_SCRIPT = """
import torch
from torch.nn import functional as F
from tests.models.drift_cases import CLASSES, FEATURES, ResidualClassifier

CONFIG = {"steps": 40, "batch_size": 64, "optimizer": "adam", "lr": 0.2}
_PROTOTYPES = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(4))


def build_model():
    return ResidualClassifier(torch.float16)


def make_batch(batch_size, device):
    labels = torch.randint(0, CLASSES, (batch_size,), device=device)
    return _PROTOTYPES[labels] + 2 * torch.randn(batch_size, FEATURES, device=device), labels


def loss_fn(logits, labels):
    return F.cross_entropy(logits, labels)
"""


def test_gradscope_run_reports_the_warnings_and_fails_on_them(tmp_path, capsys):
    script = tmp_path / "drifting.py"
    script.write_text(_DRIFTING_SCRIPT)
    report = tmp_path / "report.json"
    assert main(["run", str(script), "--json", str(report)]) == 0
    assert json.loads(report.read_text())["warnings"] is None  # not looked for
    capsys.readouterr()
    code = main(["run", str(script), "--fail-on-warning", "--json", str(report)])
    assert code == 1
    warnings = json.loads(report.read_text())["warnings"]
    assert warnings and warnings[0]["module"] == "blocks.3"
    assert warnings[0]["kind"] == "low headroom" and warnings[0]["limit"] == 65504.0
    assert set(warnings[0]) == {
        "step",
        "module",
        "kind",
        "quantity",
        "value",
        "limit",
        "evidence",
        "steps_left",
        "hint",
    }
    out = capsys.readouterr().out
    assert f"early warnings: {len(warnings)}" in out
    assert warnings[0]["evidence"] in out
    # the same run without the flag but with --early-warnings: reported, exit 0
    assert main(["run", str(script), "--early-warnings", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["warnings"] == warnings


class _WithAnEmptyOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 3)
        self.empty = nn.Linear(4, 0)  # an empty output: nothing to take a maximum of

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.empty(x).sum()


def test_an_empty_output_does_not_turn_the_warnings_off(recwarn):
    model = _WithAnEmptyOutput()
    recwarn.clear()  # torch's own, on initialising the empty weight
    x = torch.randn(5, 4)
    with gradscope.watch(model, early_warnings=True, detail_every=1) as watch:
        for _ in range(2):
            loss = model(x).square().mean()
            loss.backward()
            stats = watch.collect(loss)
    assert [str(w.message) for w in recwarn] == []
    names = [layer.name for layer in watch.layers]
    figures = dict(zip(names, stats.figures["out_max_abs"].tolist(), strict=True))
    assert figures == {"body": pytest.approx(model.body(x).abs().max().item()), "empty": 0.0}
    assert "out_log_partition" in stats.figures


@pytest.mark.parametrize("source", ["resnet18", "mobilenet_v3_small", "timm:resnet18"])
def test_zoo_models_do_not_warn(source):
    if source.startswith("timm:"):
        pytest.importorskip("timm")
    torch.set_num_threads(1)
    overrides = {"steps": 60, "image_size": 32, "batch_size": 4, "early_warnings": True}
    loaded, settings = load_with_settings(source, overrides)
    runner = StepRunner(loaded, settings)
    try:
        steps = sum(1 for _ in runner.run())
    finally:
        runner.close()
    assert steps == 60
    assert [w.describe() for w in runner.watch.early_warnings.warnings] == []


def test_the_history_keeps_a_steps_early_warnings_as_events_until_a_rewind():
    from gradscope.core.facts import EarlyWarning, StepStats
    from gradscope.core.history import RunHistory

    history = RunHistory()
    warning = EarlyWarning(3, "fc", "drifting", "max |x|", 40.0, 65504.0, "max |x| 5 -> 40")
    for step in range(5):
        zeros = np.zeros(1)
        stats = StepStats(
            step, 1.0, 1.0, zeros + 1, None, None, zeros, zeros, np.full(1, 2), zeros + 1
        )
        stats.warnings = [warning] if step == 3 else []
        history.extend([(step, 1.0, stats, None)], ["fc"])
    assert history.warnings == [warning]
    assert [(e.step, e.kind, e.layer) for e in history.events] == [(3, "warning", "fc")]
    history.rewind_to(3)
    assert history.warnings == [] and history.events == []
