"""Detail is sampled (issue #17): gradient norms, the loss, the total norm, NaN/Inf and the
status at every step; max |g|, the weight norm and the update ratio every k-th step, and on
any step that goes non-finite or changes status."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import gradscope
from gradscope.cli import main
from gradscope.core.recording import RecordingReader
from gradscope.core.report import build_report


def model_and_data(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(8, 300), nn.Tanh(), nn.Linear(300, 300), nn.LayerNorm(300), nn.Linear(300, 2)
    )  # small (foreach) and large (BLAS) tensors both
    data = [(torch.randn(16, 8), torch.randn(16, 2)) for _ in range(12)]
    return model, data


def train(watch, model, data, *, scale_at=None):
    collected = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(data):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y) * (1e6 if step == scale_at else 1.0)
        loss.backward()
        collected.append(watch.collect(loss))
        if step != scale_at:  # the blown-up step is not applied: the next one is ok again
            optimizer.step()
    return collected


def test_default_and_every_step_agree_on_norms_and_on_detail_steps():
    model, data = model_and_data()
    sparse = train(gradscope.watch(model), model, data)  # detail_every=10 by default
    model, data = model_and_data()
    full = train(gradscope.watch(model, detail_every=1), model, data)
    for step, (a, b) in enumerate(zip(sparse, full, strict=True)):
        np.testing.assert_array_equal(a.grad_norm, b.grad_norm)
        np.testing.assert_array_equal(a.param_grad_norm, b.param_grad_norm)
        assert a.total_grad_norm == b.total_grad_norm and a.loss == b.loss
        np.testing.assert_array_equal(a.status, b.status)
        if step % 10 == 0:
            np.testing.assert_array_equal(a.max_abs, b.max_abs)
            np.testing.assert_array_equal(a.weight_norm, b.weight_norm)
        else:
            assert a.max_abs is None and a.weight_norm is None  # never NaN
        assert b.max_abs is not None and b.weight_norm is not None


def test_a_status_change_or_a_nan_always_gets_the_detail():
    model, data = model_and_data()
    watch = gradscope.watch(model, explode_threshold=50.0)
    collected = train(watch, model, data, scale_at=4)  # exploding at step 4, then back
    assert collected[4].max_abs is not None  # the change of status
    assert collected[5].max_abs is not None  # and back to ok
    assert all(collected[s].max_abs is None for s in (1, 2, 3, 6, 7))
    x, y = data[0]
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    stats = watch.collect(loss)
    assert stats.nonfinite and stats.step == 12 and stats.max_abs is not None
    assert np.isnan(stats.max_abs[0])


def test_steps_without_detail_are_null_in_recordings_and_json(tmp_path, capsys):
    model, data = model_and_data()
    with gradscope.watch(model, record=tmp_path / "r.gsrec", detail_every=5) as watch:
        train(watch, model, data)
    with RecordingReader(tmp_path / "r.gsrec") as reader:
        _, history = reader.load()
    report = build_report("r", "cpu", history)
    layer = report["layers"][0]
    assert [v is None for v in layer["max_abs"]] == [s % 5 != 0 for s in range(12)]
    assert [v is None for v in layer["weight_norm"]] == [s % 5 != 0 for s in range(12)]
    assert all(v is not None for v in layer["grad_norm"])

    script = tmp_path / "m.py"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))\n"
        "def make_batch(n, device):\n    return torch.randn(n, 4), torch.randn(n, 1)\n"
    )
    out = tmp_path / "run.json"
    assert (
        main(["run", str(script), "--steps", "4", "--detail-every", "3", "--json", str(out)]) == 0
    )
    capsys.readouterr()
    layer = json.loads(out.read_text())["layers"][0]
    assert [v is None for v in layer["max_abs"]] == [False, True, True, False]


def test_detail_every_must_be_positive():
    model, _ = model_and_data()
    with pytest.raises(Exception, match="detail_every must be >= 1"):
        gradscope.watch(model, detail_every=0)
