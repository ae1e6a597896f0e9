"""Long steps (a big model on a CPU): Pause and Stop answer at once, the status bar shows
where the step is, Quit closes the window without waiting for the step (issue 15, defect 4)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gui_helpers import RUN_TIMEOUT, open_and_wait

SLOW_MODULES = """
import time
import torch
from torch import nn

CONFIG = {"steps": 100, "batch_size": 2, "device": "cpu", "rewind_depth": 0}


class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        time.sleep(0.5)
        return self.fc(x)


def build_model():
    return nn.Sequential(Slow(), Slow(), Slow(), Slow())


def make_batch(batch_size, device):
    return torch.randn(batch_size, 3), torch.randn(batch_size, 3)
"""


def _slow_model(qtbot, window, tmp_path: Path) -> None:
    script = tmp_path / "slow_modules.py"
    script.write_text(SLOW_MODULES)
    open_and_wait(qtbot, window, str(script))


def test_pause_answers_at_once_and_the_step_shows_its_progress(qtbot, window, tmp_path):
    _slow_model(qtbot, window, tmp_path)
    window.run()
    # The first step is measured slow: from the next one on, progress is counted.
    qtbot.waitUntil(lambda: window.history.count >= 1, timeout=RUN_TIMEOUT)
    qtbot.waitUntil(lambda: "forward" in window.progress_label.text(), timeout=RUN_TIMEOUT)
    assert window.progress_label.text().startswith("step 1: forward ")
    window.pause()
    assert "Pausing after this step" in window.state_label.text()
    assert not window.pause_action.isEnabled()
    qtbot.waitUntil(lambda: window.state == "paused", timeout=RUN_TIMEOUT)
    assert window.progress_label.text() == ""
    assert window.history.count == 2  # the step going on was finished, not abandoned


def test_stop_answers_at_once_and_abandons_the_step(qtbot, window, tmp_path):
    _slow_model(qtbot, window, tmp_path)
    window.run()
    qtbot.waitUntil(lambda: window.history.count >= 1, timeout=RUN_TIMEOUT)
    progress = window.run_thread.worker.progress
    qtbot.waitUntil(lambda: progress.snapshot() is not None, timeout=RUN_TIMEOUT)
    done = window.history.count
    started = time.perf_counter()
    window.stop()
    assert "the step going on is abandoned" in window.state_label.text()
    assert not window.stop_action.isEnabled() and not window.pause_action.isEnabled()
    qtbot.waitUntil(lambda: window.state == "stopped", timeout=RUN_TIMEOUT)
    # A step takes 2 s (four modules of 0.5 s); Stop abandons it at the next module, as
    # Quit does (issue 27: it waited for the whole step).
    assert time.perf_counter() - started < 1.2
    assert window.history.count == done
    # Run after Stop starts afresh (a new run of the reloaded model).
    with qtbot.waitSignal(window.model_loaded, timeout=RUN_TIMEOUT):
        window.run()
    qtbot.waitUntil(lambda: window.history.count >= 1, timeout=RUN_TIMEOUT)
    window.stop()
    qtbot.waitUntil(lambda: window.state == "stopped", timeout=RUN_TIMEOUT)


def test_closing_the_window_does_not_wait_for_the_step(qtbot, window, tmp_path):
    _slow_model(qtbot, window, tmp_path)
    window.run()
    qtbot.waitUntil(lambda: window.history.count >= 1, timeout=RUN_TIMEOUT)
    progress = window.run_thread.worker.progress
    qtbot.waitUntil(lambda: progress.snapshot() is not None, timeout=RUN_TIMEOUT)
    started = time.perf_counter()
    window.close()
    took = time.perf_counter() - started
    assert not window.isVisible()
    assert not window.run_thread.thread.isRunning()
    # A step takes 2 s (four modules of 0.5 s); it is abandoned at the next module.
    assert took < 1.2, took


@pytest.mark.filterwarnings("ignore::FutureWarning")  # inception_v3 init notice
def test_torchvision_models_get_cpu_friendly_defaults_the_settings_show(qtbot, window):
    open_and_wait(qtbot, window, "resnet18")
    settings = window.run_thread.worker.runner.settings
    assert (settings.image_size, settings.batch_size) == (64, 4)
    panel = window.settings_panel
    assert panel.image_size.value() == 64 and panel.batch_size.value() == 4
    assert "CPU-friendly" in panel.model_notes.text() and panel.model_notes.isVisibleTo(panel)
    assert panel.overridden() == []  # the app's defaults, not the user's changes
    # Never below the size a model needs.
    open_and_wait(qtbot, window, "inception_v3")
    # (inception_v3's training-mode auxiliary head needs its full 299 crop, issue #16.)
    assert window.run_thread.worker.runner.settings.image_size == 299
    assert "at least 299x299" in panel.model_notes.text()
    # A model script keeps its own values (its own note only).
    sample = Path(__file__).parents[2] / "sample_models" / "seed_explosion.py"
    open_and_wait(qtbot, window, str(sample))
    assert window.run_thread.worker.runner.settings.image_size == 224
    assert "CPU-friendly" not in panel.model_notes.text()
