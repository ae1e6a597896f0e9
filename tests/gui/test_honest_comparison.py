"""Issue 38: compared runs drawn honestly, and views that follow what is shown."""

from __future__ import annotations

import numpy as np
from test_plots import _history, _view


def test_a_heatmap_of_one_layer_is_drawn(qtbot) -> None:
    from gradscope.gui.plots import HeatmapPlot

    names, history, _ = _history(layers=3, steps=30)
    heatmap = HeatmapPlot()
    qtbot.addWidget(heatmap)
    heatmap.resize(600, 400)
    heatmap.show()
    heatmap.refresh(_view(names, history, visible=[names[1]]))
    heatmap.image.render()
    image = heatmap.image.qimage
    assert image is not None and image.width() == 30 and image.height() >= 1
    # Each step's cell carries the colour computed for it (not blank).
    for step in (0, 17, 29):
        color = image.pixelColor(step, 0)
        assert (color.red(), color.green(), color.blue()) == tuple(heatmap.rgba[step, 0, :3])


def test_a_rewound_branch_stays_with_its_model(qtbot, window, scripts) -> None:
    from gui_helpers import RUN_TIMEOUT, open_and_wait, run_and_wait

    open_and_wait(qtbot, window, scripts["tiny"], rewind_depth=5)
    run_and_wait(qtbot, window, window.run)
    with qtbot.waitSignal(window.debugger.rewound, timeout=RUN_TIMEOUT):
        assert window.debugger.rewind(2)
    qtbot.waitUntil(lambda: window.state != "running", timeout=RUN_TIMEOUT)
    assert [run.name for run in window.comparison.runs] == ["branch 2-4 (rewound)"]
    # Another model: its plots start clean, without the old branch or its legend.
    open_and_wait(qtbot, window, scripts["nan"])
    window._refresh()
    assert window.comparison.runs == ()
    assert not window.plots.loss.compared_curves
    assert not window.plots.gradient_norm.compared_curves
    legend = [label.text for _, label in window.plots.loss.legend.items]
    assert not any("rewound" in text or "missing" in text for text in legend)


def test_a_compared_recording_leaves_with_its_model_unless_pinned(
    qtbot, window, scripts, tmp_path
) -> None:
    from gui_helpers import open_and_wait
    from test_dashboard_plots import record_run

    first = record_run(tmp_path / "A.gsrec", steps=13, seed=0)
    second = record_run(tmp_path / "B.gsrec", steps=30, seed=1)
    assert window.recordings.open_recording(second)
    assert window.comparison.add_recording(first)
    open_and_wait(qtbot, window, scripts["tiny"])
    assert window.comparison.runs == ()
    assert not window.comparison.clear_action.isEnabled()
    # Pinned, a compared run stays through a model change.
    assert window.recordings.open_recording(second)
    assert window.comparison.add_recording(first)
    window.comparison.pin_action.setChecked(True)
    open_and_wait(qtbot, window, scripts["tiny"])
    assert [run.name for run in window.comparison.runs] == ["A.gsrec"]


def test_skipped_steps_are_skipped_in_the_per_parameter_view_too(qtbot, window) -> None:
    from pathlib import Path

    from gui_helpers import open_and_wait, run_and_wait

    from gradscope.gui.mixed_precision import SKIPPED_WORDS

    sample = Path(__file__).resolve().parents[2] / "sample_models/fp16_scaler_healthy_skips.py"
    open_and_wait(qtbot, window, str(sample), steps=10)
    run_and_wait(qtbot, window, window.run)
    norm = window.plots.gradient_norm
    norm.statistic_selector.choose("param_grad_norm")
    window._refresh()
    assert norm.per_parameter and norm.curves
    assert norm.skipped.steps.tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert norm._edge_points == []  # no NaN/Inf marker: they are the scaler's skips
    legend = [label.text for _, label in norm.legend.items]
    assert SKIPPED_WORDS in legend
