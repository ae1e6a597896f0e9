"""Following a recording that another loop is writing: the first NaN/Inf that arrives while
following fills the Diagnosis pane, whatever its phase (issue 27: an input-phase origin
reached the tree and Events, and Diagnosis kept saying "No NaN/Inf so far")."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

import gradscope
from gradscope.core.recording import RecordingReader

TIMEOUT = 30_000


def _step(watch, model: nn.Module, inputs: torch.Tensor) -> None:
    target = torch.zeros(len(inputs), 1)

    def compute_loss() -> torch.Tensor:
        return nn.functional.mse_loss(model(inputs), target)

    loss = compute_loss()
    loss.backward()
    watch.collect(loss, locate=compute_loss)
    model.zero_grad()


def _follow_until_origin(qtbot, window, tmp_path: Path, bad_batch: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    path = tmp_path / "followed.gsrec"
    watch = gradscope.watch(model, record=path, commit_seconds=0.05)
    try:
        for _ in range(3):
            _step(watch, model, torch.randn(2, 4))
        qtbot.waitUntil(lambda: RecordingReader(path).row_count() >= 3, timeout=TIMEOUT)
        assert window.recordings.open_recording(path)
        assert window.recordings.follow_action.isChecked()
        diagnosis = window.debugger.diagnosis
        assert diagnosis.origin is None
        inputs = torch.randn(2, 4)
        if bad_batch:
            inputs[1, 2] = math.inf  # the loop's own batch holds the Inf
        else:
            with torch.no_grad():
                model[2].weight.fill_(math.inf)  # the model makes it
        _step(watch, model, inputs)
        qtbot.waitUntil(lambda: window.history.first_nonfinite is not None, timeout=TIMEOUT)
        qtbot.waitUntil(lambda: diagnosis.origin is not None, timeout=5_000)
        assert diagnosis.origin is window.history.first_nonfinite
        assert diagnosis.summary.text() != "No NaN/Inf so far."
    finally:
        watch.close()


def test_followed_input_origin_fills_diagnosis(qtbot, window, tmp_path) -> None:
    _follow_until_origin(qtbot, window, tmp_path, bad_batch=True)
    assert window.debugger.diagnosis.origin.phase == "input"
    assert window.debugger.diagnosis.origin.step == 3
    assert "input" in window.debugger.diagnosis.summary.text().lower()


def test_followed_model_origin_fills_diagnosis(qtbot, window, tmp_path) -> None:
    _follow_until_origin(qtbot, window, tmp_path, bad_batch=False)
    assert window.debugger.diagnosis.origin.phase != "input"
