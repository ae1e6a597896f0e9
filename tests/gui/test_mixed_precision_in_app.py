"""The app on mixed-precision runs (#13): the loss scaler's skipped steps have their own
purple marker (never the NaN/Inf one), the loss scale is plotted, a scale collapse is an
event, and the settings offer mixed precision for the next run. Real GradScaler runs of the
samples, on CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gradscope.core.watch import STATUS_NONFINITE
from gradscope.gui.mixed_precision import SKIPPED_WORDS
from gradscope.gui.plots.heatmap_colors import NONFINITE_RGBA, SKIPPED_RGBA
from tests.gui.gui_helpers import open_and_wait, run_and_wait

SAMPLES = Path(__file__).resolve().parents[2] / "sample_models"


def _legend_words(legend) -> list[str]:
    return [label.text for _, label in legend.items]


def _has_color(rgba: np.ndarray, color: tuple[int, ...]) -> bool:
    return bool((rgba.reshape(-1, 4) == np.array(color, dtype=rgba.dtype)).all(axis=1).any())


def test_skipped_steps_are_their_own_marker_not_nan(qtbot, window):
    open_and_wait(qtbot, window, str(SAMPLES / "fp16_scaler_healthy_skips.py"), steps=10)
    paused = run_and_wait(qtbot, window, window.run)
    assert paused.reason == "completed"
    window._refresh()
    history = window.history
    skipped = history.steps[: history.count][history.skipped[: history.count]].tolist()
    assert skipped == [0, 1, 2, 3, 4, 6, 7]  # the sample's documented skips
    norm, loss = window.plots.gradient_norm, window.plots.loss
    # Their own marker on both plots, and no NaN/Inf marker, cell or event anywhere.
    assert norm.skipped.steps.tolist() == skipped
    assert loss.skipped.steps.tolist() == skipped
    assert norm._edge_points == []
    assert not len(loss._nonfinite_steps)
    assert SKIPPED_WORDS in _legend_words(norm.legend)
    assert SKIPPED_WORDS in _legend_words(loss.legend)
    rgba = window.plots.heatmap.rgba
    assert not _has_color(rgba, NONFINITE_RGBA)
    assert _has_color(rgba, SKIPPED_RGBA)
    assert "purple: skipped)" in window.plots.heatmap.item.titleLabel.text
    assert window.events_panel.row_count() == 0
    assert history.first_nonfinite is None
    # The loss scale, on the loss plot's right axis (log10 of the engine's values).
    assert loss.loss_scale.shown and loss.item.getAxis("right").isVisible()
    _, y = loss.loss_scale.curve.getData()
    assert np.allclose(10**y, history.loss_scale[: history.count])
    assert np.isclose(10 ** y[0], 2.0**24)
    # Skipped steps counted apart from failures.
    text = window.precision_label.text()
    assert "7 skipped" in text and "0 NaN/Inf" in text, text


def test_scale_collapse_is_a_failure_and_an_event(qtbot, window):
    open_and_wait(qtbot, window, str(SAMPLES / "fp16_scale_collapse_zero_norm.py"))
    paused = run_and_wait(qtbot, window, window.run)
    assert paused.reason == "nonfinite"  # pauses like a NaN
    window._refresh()
    history = window.history
    origin = history.first_nonfinite
    assert origin is not None and origin.step == 17
    row = history.row_of_step(17)
    assert (history.status_matrix()[row] == STATUS_NONFINITE).any()
    # The collapse step is a failure: NaN/Inf marker and red cell, not the skipped diamond.
    norm = window.plots.gradient_norm
    assert 17 not in norm.skipped.steps.tolist()
    assert 16 in norm.skipped.steps.tolist()
    assert any(step == 17 for _, step, _ in norm._edge_points)
    assert _has_color(window.plots.heatmap.rgba, NONFINITE_RGBA)
    events = window.events_panel
    assert events.table.item(0, 1).text() == "Loss scale collapse"
    assert events.table.item(0, 0).text() == "17"
    scale = origin.details["scale_collapse"]
    assert f"loss scale collapsed to {scale:g}" in events.table.item(0, 3).text()
    assert f"loss scale collapsed to {scale:g}" in events.banner.text()
    assert "1 NaN/Inf" in window.precision_label.text()
    # The diagnosis names the line with the sqrt.
    assert "torch.sqrt" in window.debugger.diagnosis.source.toPlainText()


def test_mixed_precision_setting_applies_at_restart(qtbot, window, scripts):
    open_and_wait(qtbot, window, scripts["tiny"], steps=2)
    run_and_wait(qtbot, window, window.run)
    window._refresh()
    loss = window.plots.loss
    # No scaler: no loss scale axis, no skipped words.
    assert not loss.loss_scale.shown and not loss.item.getAxis("right").isVisible()
    assert not window.precision_label.isVisible()
    panel = window.settings_panel
    panel.amp.setCurrentIndex(panel.amp.findData("fp16"))
    panel.amp_init_scale.set_value(2.0**20)
    panel.amp_init_scale.value_edited.emit()
    assert {"amp", "amp_init_scale"} <= set(panel.needs_restart())
    note = panel.restart_note.text()
    assert note.startswith("mixed precision, initial loss scale changed") and "Restart" in note
    # A step of the running run keeps its precision (the engine refuses a change mid-run).
    run_and_wait(qtbot, window, window.step)
    assert window.error_dialog is None
    assert not window.history.loss_scale[: window.history.count].any()
    with qtbot.waitSignal(window.model_loaded, timeout=30_000) as loaded:
        window.restart()
    assert loaded.args[0].settings.amp == "fp16"
    assert loaded.args[0].settings.amp_init_scale == 2.0**20
    run_and_wait(qtbot, window, window.step)
    assert window.history.loss_scale[0] == 2.0**20
    assert panel.needs_restart() == []
