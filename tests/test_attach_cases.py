"""``gradscope attach`` as right as the watch on unmodified scripts (issue #35): nothing of
it in the script's saved or copied objects, step 0 located, a GradScaler's scale taken out
and its skipped steps recorded as skipped, gradients read before the script clips them,
and a model trained through ``model.forward(x)``. Each script is tests/models/
attach_cases.py, run in a subprocess as ``python SCRIPT`` and as ``gradscope attach``; the
reference is the same loop calling ``gradscope.watch`` itself (``--watch``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradscope.core.facts import STATUS_EXPLODING, STATUS_NONFINITE, STATUS_SKIPPED
from gradscope.core.recording import RecordingReader

TESTS = Path(__file__).parent
REPO = TESTS.parent
SCRIPT = TESTS / "models" / "attach_cases.py"


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


def _attached(tmp_path: Path, *script_args: str, options: tuple[str, ...] = ()):
    record = tmp_path / "run.gsrec"
    result = _python(
        "-m", "gradscope", "attach", *options, "--record", str(record), str(SCRIPT), *script_args,
        cwd=tmp_path,
    )  # fmt: skip
    with RecordingReader(record) as reader:
        _, history = reader.load()
        info = dict(reader.info)
    return result, history, info


def _watched(tmp_path: Path, *script_args: str) -> list[dict]:
    """The reference: each step as the script's own ``gradscope.watch`` saw it."""
    result = _python(str(SCRIPT), *script_args, "--watch", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("case", ["save", "save-by-hand"])
def test_saving_pickling_and_copying_the_model_is_as_without_gradscope(tmp_path, case):
    plain = _python(str(SCRIPT), "--case", case, cwd=tmp_path)
    attached, history, info = _attached(tmp_path, "--case", case, "--out", "attached")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert attached.returncode == 0, attached.stderr[-3000:]
    assert attached.stdout == plain.stdout
    # the copies carry nothing of GradScope: no hook, nothing in the call slot
    assert "hooks on the copies: [0, 0, 0, 0]" in attached.stdout
    assert "their own call: [None, None, None, None]" in attached.stdout
    assert history.steps.tolist() == [0, 1, 2, 3]
    # the model's step loss is the script's, not the EMA's call (made with autograd on)
    printed = [float(line.split()[-1]) for line in plain.stdout.splitlines() if " loss " in line]
    assert history.losses.tolist() == pytest.approx(printed, abs=1e-5)
    if case == "save-by-hand":  # no optimizer: each step read at the script's clipping
        assert info["clipping"].startswith("clip_grad_value_(0.5) by the script")


@pytest.mark.parametrize("case", ["nan-pixel", "sqrt0"])
def test_a_nan_at_step_0_is_located_as_the_watch_locates_it(tmp_path, case):
    args = ("--case", case, "--bad-step", "0", "--steps", "2")
    reference = _watched(tmp_path, *args)[0]["origin"]
    result, history, _ = _attached(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    origin = history.first_nonfinite
    found = {name: getattr(origin, name) for name in ("step", "phase", "module", "op", "line")}
    assert found == {name: reference[name] for name in found}
    if case == "nan-pixel":
        assert (origin.phase, origin.details["samples"]) == ("input", [5])
    else:
        lines = SCRIPT.read_text().splitlines()
        sqrt_line = next(i for i, text in enumerate(lines, 1) if "torch.sqrt(" in text)
        assert (origin.phase, origin.module, origin.line) == ("backward", "dist", sqrt_line)


def test_a_nan_in_the_third_micro_batch_of_step_0_is_located_in_that_call(tmp_path):
    args = ("--case", "sqrt0", "--bad-step", "0", "--steps", "2", "--micro", "3")
    result, history, _ = _attached(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    origin = history.first_nonfinite
    assert (origin.step, origin.phase, origin.module) == (0, "backward", "dist")
    assert origin.details["forward_call"] == 2  # each call captured once, in order


def test_a_persisting_float16_overflow_under_a_grad_scaler_is_an_episode(tmp_path):
    args = ("--case", "fp16-sgd", "--bad-step", "2", "--steps", "5")
    reference = _watched(tmp_path, *args)
    result, history, _ = _attached(tmp_path, *args, options=("--fail-on-nonfinite",))
    assert result.returncode == 1, result.stderr[-3000:]  # the script exited 0
    # every iteration is a step, the skipped ones too (the scaler skipped steps 2-4)
    assert history.steps.tolist() == [0, 1, 2, 3, 4]
    assert not history.skipped.any()
    origin = history.first_nonfinite
    expected = reference[2]["origin"]
    assert (origin.step, origin.phase, origin.module, origin.op, origin.line) == (
        2, "forward", expected["module"], expected["op"], expected["line"]
    )  # fmt: skip
    statuses = history.status_matrix()
    assert (statuses[2:] == STATUS_NONFINITE).all() and (statuses[:2] != STATUS_NONFINITE).all()
    # the loss recorded is the script's, not the scaled one backward() was called on
    assert history.losses[:2].tolist() == pytest.approx([s["loss"] for s in reference[:2]])


def test_a_fused_optimizer_without_unscale_gives_unscaled_figures_and_skipped_steps(tmp_path):
    args = ("--case", "fp16-fused", "--steps", "10")
    reference = _watched(tmp_path, *args)
    result, history, _ = _attached(tmp_path, *args, options=("--fail-on-nonfinite",))
    assert result.returncode == 0, result.stderr[-3000:]
    skipped = [s["skipped"] for s in reference]
    assert skipped[:2] == [True, True] and skipped[-1] is False  # the scale came down
    assert history.steps.tolist() == list(range(10))
    assert history.skipped[: history.count].tolist() == skipped
    assert history.first_nonfinite is None  # the scaler's own overflows: no origin
    statuses = history.status_matrix()
    assert (statuses[np.array(skipped)] == STATUS_SKIPPED).any(axis=1).all()
    assert not (statuses == STATUS_NONFINITE).any()
    assert history.losses.tolist() == pytest.approx([s["loss"] for s in reference])
    applied = [i for i, s in enumerate(skipped) if not s]
    totals = [reference[i]["total"] for i in applied]
    assert all(math.isfinite(t) and t < 10 for t in totals)  # unscaled: the scale is >= 2**16
    recorded = history.total_grad_norm[: history.count]
    assert recorded[applied].tolist() == pytest.approx(totals)
    assert "8 skipped by the GradScaler" in result.stderr


def test_gradients_are_read_before_the_script_clips_them(tmp_path):
    result, history, info = _attached(tmp_path, "--case", "clip", "--steps", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    # clip_grad_norm_ returns the norm before clipping: the one recorded
    norms = [float(line.split()[-1]) for line in result.stdout.splitlines() if " norm " in line]
    assert min(norms) > 1000
    recorded = history.total_grad_norm[: history.count].tolist()
    assert recorded == pytest.approx(norms, rel=1e-3)
    assert (history.status_matrix() == STATUS_EXPLODING).any(axis=1).all()
    assert info["clipping"].startswith("clip_grad_norm_(1.0) by the script")


def test_a_model_trained_through_forward_is_recorded(tmp_path):
    result, history, _ = _attached(tmp_path, "--case", "forward", "--steps", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert history.steps.tolist() == [0, 1, 2]
    assert history.layer_names == ["fc1", "fc2"]
    printed = [float(line.split()[-1]) for line in result.stdout.splitlines() if " loss " in line]
    assert history.losses.tolist() == pytest.approx(printed, abs=1e-5)
    assert "Net is trained through direct .forward() calls" in result.stderr


GAN_STEP_0 = """
import torch
from torch import nn
torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
D = nn.Sequential(nn.Linear(8, 1))
opt_g = torch.optim.SGD(G.parameters(), lr=0.1)
opt_d = torch.optim.SGD(D.parameters(), lr=0.1)
for step in range(3):
    z = torch.randn(6, 4)
    if step == 0:
        z[2, 1] = float("nan")
    fake = G(z)
    opt_d.zero_grad()
    D(torch.randn(6, 8)).mean().backward()
    opt_d.step()
    opt_g.zero_grad()
    (-D(fake).mean()).backward()
    opt_g.step()
"""


def test_a_model_matched_after_another_models_step_keeps_its_step_0(tmp_path):
    # The generator runs before the discriminator's step ends the search for models; its
    # optimizer steps after: its step 0 is still captured.
    script = tmp_path / "gan.py"
    script.write_text(GAN_STEP_0)
    record = tmp_path / "gan.gsrec"
    result = _python(
        "-m", "gradscope", "attach", "--record", str(record), str(script), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with RecordingReader(tmp_path / "gan.Sequential.gsrec") as reader:
        _, generator = reader.load()
    origin = generator.first_nonfinite
    assert (origin.step, origin.phase, origin.details["samples"]) == (0, "input", [2])


def test_the_finder_keeps_nothing_of_modules_the_script_let_go_of():
    import gc

    import torch

    from gradscope.core.attach.model_finder import ModelFinder

    finder = ModelFinder()
    finder.start()
    try:
        for _ in range(200):  # a script that builds a module in its loop
            torch.nn.Linear(2, 2)
        gc.collect()
        kept = torch.nn.Sequential(torch.nn.Linear(2, 2))
        assert len(finder._owner) == 2
        # found from its parameters alone, never called
        assert finder.owners(kept.parameters()) == ([kept], 0)
    finally:
        finder.close()
