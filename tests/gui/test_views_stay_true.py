"""Views that stay true to what is loaded (issue 15): no blank, stale or misleading views
after switching models, opening recordings or walking a trace."""

from __future__ import annotations

from gui_helpers import open_and_wait, run_and_wait


def _x_range(window) -> tuple[float, float]:
    return tuple(window.plots.gradient_norm.item.vb.viewRange()[0])


def test_a_new_model_starts_fitted_after_a_zoom(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.run)
    vb = window.plots.gradient_norm.item.vb
    # The user zooms far from the data (as a drag or the wheel does).
    vb.setXRange(400, 500, padding=0)
    vb.sigRangeChangedManually.emit(vb.state["mouseEnabled"])
    assert window.plots.follow_range is False
    open_and_wait(qtbot, window, scripts["nan"])
    run_and_wait(qtbot, window, window.run)
    window._refresh()
    low, high = _x_range(window)
    assert low <= 0 and high >= 2, (low, high)
