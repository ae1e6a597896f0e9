"""The window driving real runs of tiny models on the run thread."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from gui_helpers import LOAD_TIMEOUT, RUN_TIMEOUT, open_and_wait, run_and_wait
from PySide6.QtCore import QPointF, Qt

from gradscope.core.history import MISSING
from gradscope.core.watch import STATUS_NONFINITE
from gradscope.gui.module_tree_model import STATUS
from gradscope.gui.selection import Selection
from gradscope.gui.status_style import ORIGIN_TINT

CHECK = Qt.ItemDataRole.CheckStateRole


def watched_names(window) -> list[str]:
    return [layer.name for layer in window.run_thread.worker.runner.watch.layers]


def test_open_and_run_fills_history_plots_and_status_bar(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    assert window.state == "ready"
    assert window.tree_model.watched_layers() == ["0", "2"]
    paused = run_and_wait(qtbot, window, window.run)
    assert paused.reason == "completed"
    assert window.state == "done"
    assert window.history.count == 5
    assert set(window.plots.gradient_norm.curves) == {"0", "2"}
    x, y = window.plots.gradient_norm.curves["0"].getData()
    assert len(x) == 5 and np.isfinite(y).all()
    assert "step: 4" in window.step_label.text()
    assert window.device_label.text() == "device: cpu"
    # The tree shows the engine's numbers for the latest step.
    assert window.tree_model.data(window.tree_model.index_of("0", STATUS)) == "ok"


def test_ticking_a_row_changes_what_the_engine_watches(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.step)
    assert watched_names(window) == ["0", "2"]
    window.tree_model.setData(window.tree_model.index_of("2"), Qt.CheckState.Unchecked, CHECK)
    run_and_wait(qtbot, window, window.step)
    assert watched_names(window) == ["0"]
    # The step after the change has no value for the unticked layer.
    assert window.history.series("grad_norm", "2").tolist()[-1] == MISSING
    assert not window.plots.gradient_norm.curves["2"].isVisible()
    window.tree_model.setData(window.tree_model.index_of(""), Qt.CheckState.Checked, CHECK)
    run_and_wait(qtbot, window, window.step)
    assert watched_names(window) == ["0", "2"]


def test_engine_watch_shows_in_the_tree(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"], layers=["2"])
    model = window.tree_model
    assert watched_names(window) == ["2"]
    assert model.data(model.index_of("2"), CHECK) == Qt.CheckState.Checked
    assert model.data(model.index_of("0"), CHECK) == Qt.CheckState.Unchecked
    assert model.data(model.index_of(""), CHECK) == Qt.CheckState.PartiallyChecked


def test_nan_run_pauses_marks_the_origin_and_fills_events(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["nan"])
    paused = run_and_wait(qtbot, window, window.run)
    assert paused.reason == "nonfinite"
    assert window.state == "halted"
    assert window.history.count == 3  # paused at step 2 of 20, like a breakpoint
    model = window.tree_model
    origin = model.index_of("features")
    assert model.origin == "features"
    assert model.data(origin, Qt.ItemDataRole.BackgroundRole).color().name() == ORIGIN_TINT
    assert model.data(model.index_of("features.proj", STATUS)) == "NaN/Inf"
    # The tree scrolled to and selected the origin row.
    current = window.tree_proxy.mapToSource(window.tree_view.currentIndex())
    assert model.node(current).name == "features"
    assert window.selected_step == 2
    events = window.events_panel
    assert events.row_count() >= 2
    assert events.table.item(0, 1).text() == "NaN/Inf origin"
    assert events.table.item(0, 2).text() == "features"
    assert events.banner_area.isVisibleTo(events) and "step 2" in events.banner.text()
    assert "torch.log" in events.banner.text() and "output (" in events.banner.text()
    # Non-finite points are markers at the plot edge, and red cells in the heatmap.
    assert len(window.plots.gradient_norm.markers.points()) >= 1
    heatmap = window.plots.heatmap
    nonfinite_cells = (heatmap.rgba[..., 0] == 214) & (heatmap.rgba[..., 1] == 39)
    assert nonfinite_cells[-1].any() and not nonfinite_cells[0].any()
    assert "NaN/Inf" in window.state_label.text()
    # Clicking the origin event selects its layer and step.
    window.select("head", 0)
    events.table.cellClicked.emit(0, 2)
    assert window.selected_layer == "features" and window.selected_step == 2


def test_keep_going_setting_turns_the_breakpoint_off(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["nan"], keep_going=True, steps=6)
    paused = run_and_wait(qtbot, window, window.run)
    assert paused.reason == "completed"
    assert window.history.count == 6
    assert window.history.first_nonfinite is not None


def test_settings_changed_while_paused_apply_from_the_next_step(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.step)
    panel = window.settings_panel
    panel.lr.setText("0.5")
    panel.lr.editingFinished.emit()
    panel.clip_enabled.setChecked(True)
    panel.clip.setText("0.25")
    panel.clip.editingFinished.emit()
    runner = window.run_thread.worker.runner
    assert runner.settings.lr != 0.5  # nothing changes until the next step
    run_and_wait(qtbot, window, window.step)
    assert runner.settings.lr == 0.5
    assert runner.settings.clip == 0.25
    assert runner.optimizer.param_groups[0]["lr"] == 0.5
    assert window.history.count == 2


def test_pause_step_stop_and_close_leave_no_thread(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["slow"])
    window.run()
    assert window.state == "running"
    qtbot.waitUntil(lambda: window.history.count >= 2, timeout=RUN_TIMEOUT)
    paused = run_and_wait(qtbot, window, window.pause)
    assert paused.reason == "requested" and window.state == "paused"
    done = window.history.count
    paused = run_and_wait(qtbot, window, window.step)
    assert paused.steps_done == 1 and window.history.count == done + 1
    window.run()
    qtbot.waitUntil(lambda: window.history.count >= done + 3, timeout=RUN_TIMEOUT)
    paused = run_and_wait(qtbot, window, window.stop)
    assert paused.reason == "stopped" and window.state == "stopped"
    steps_after_stop = window.history.count
    assert steps_after_stop < 1000  # the history stays on screen after Stop
    window.run()  # Run after Stop starts a fresh run of the model
    qtbot.waitUntil(lambda: window.state == "running" and window.history.count >= 1,
                    timeout=RUN_TIMEOUT)
    window.close()  # while running: the thread is stopped and joined
    assert not window.run_thread.thread.isRunning()


def test_broken_script_shows_an_error_and_the_app_survives(qtbot, window, scripts) -> None:
    with qtbot.waitSignal(window.error_shown, timeout=LOAD_TIMEOUT) as blocker:
        window.open_model(scripts["broken"])
    failure = blocker.args[0]
    assert failure.stage == "load"
    dialog = window.error_dialog
    assert dialog is not None and dialog.isVisible()
    assert "TypeError" in dialog.message
    assert any("nn.Linear(3, 1) + 1" in line for line in dialog.details)
    assert "nn.Linear(3, 1) + 1" in dialog.traceback.toPlainText()
    assert window.state == "failed"
    dialog.close()
    open_and_wait(qtbot, window, scripts["tiny"])
    assert run_and_wait(qtbot, window, window.run).reason == "completed"


def test_step_error_keeps_the_history_on_screen(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["fails"])
    with qtbot.waitSignal(window.error_shown, timeout=RUN_TIMEOUT) as blocker:
        window.run()
    failure = blocker.args[0]
    assert failure.stage == "step"
    assert "does not fit" in failure.message
    qtbot.waitUntil(lambda: window.state != "running", timeout=RUN_TIMEOUT)
    assert window.history.count == 3
    assert window.error_dialog.isVisible()
    assert len(window.plots.gradient_norm.curves["0"].getData()[0]) == 3


def test_fast_steps_are_coalesced(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"], steps=400)
    batches = []
    window.run_thread.worker.steps_finished.connect(lambda payload: batches.append(payload))
    run_and_wait(qtbot, window, window.run)
    assert window.history.count == 400
    assert len(batches) < 200  # many steps per signal, not one signal per step


def test_plot_clicks_select_the_tree_row_and_step(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.run)
    window.plots.selection_made.emit(Selection("2", 1))
    current = window.tree_proxy.mapToSource(window.tree_view.currentIndex())
    assert window.tree_model.node(current).name == "2"
    assert window.selected_step == 1
    assert window.plots.flow.step is not None
    window._refresh()
    assert window.plots.flow.step == 1
    assert window.plots.gradient_norm.curves["2"].opts["pen"].widthF() > \
        window.plots.gradient_norm.curves["0"].opts["pen"].widthF()
    # A heatmap cell maps back to a layer and a step.
    heatmap = window.plots.heatmap
    window.grab()
    scene_pos = heatmap.item.vb.mapViewToScene(QPointF(3, 1))  # step 3, second layer
    assert heatmap.cell_at(scene_pos)[:2] == ("2", 3)
    with qtbot.waitSignal(window.plots.selection_made) as blocker:
        heatmap.selection_made.emit(Selection(*heatmap.cell_at(scene_pos)[:2]))
    assert blocker.args[0] == Selection("2", 3)
    # Selecting a row in the tree highlights its curve.
    window.tree_view.setCurrentIndex(window.tree_proxy.mapFromSource(
        window.tree_model.index_of("0")))
    assert window.selected_layer == "0"


def test_exports_and_persistence(qtbot, window, scripts, tmp_path: Path, preferences) -> None:
    open_and_wait(qtbot, window, scripts["tiny"])
    run_and_wait(qtbot, window, window.run)
    csv_path = tmp_path / "norms.csv"
    window.export_csv(str(csv_path))
    rows = list(csv.reader(csv_path.open()))
    assert rows[0] == ["step", "loss", "0", "2"] and len(rows) == 6
    assert window.export_png(str(tmp_path / "plots.png"))
    assert (tmp_path / "plots.png").stat().st_size > 1000
    # SVG through Qt's generator: vector curves and text. pyqtgraph's own SVG exporter
    # (which fails under this Qt) is not offered in its right-click export dialog.
    import xml.etree.ElementTree as ElementTree

    import pyqtgraph.exporters

    assert window.export_svg(str(tmp_path / "plots.svg"))
    root = ElementTree.parse(tmp_path / "plots.svg").getroot()
    tags = [element.tag.rsplit("}", 1)[-1] for element in root.iter()]
    assert tags[0] == "svg" and tags.count("path") > 3 and "text" in tags
    assert pyqtgraph.exporters.SVGExporter not in pyqtgraph.exporters.listExporters()
    assert pyqtgraph.exporters.ImageExporter in pyqtgraph.exporters.listExporters()
    window.settings_panel.batch_size.setValue(3)
    window.settings_panel.batch_size.editingFinished.emit()
    window.close()
    assert preferences.value("model/last") == scripts["tiny"]
    assert window.recent_models()[0] == scripts["tiny"]
    assert preferences.value("window/geometry") is not None
    assert window._persisted_overrides(scripts["tiny"]) == {"batch_size": 3}


def test_nonfinite_status_in_history_matches_tree(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["nan"])
    run_and_wait(qtbot, window, window.run)
    history = window.history
    last = history.status_matrix()[-1]
    flagged = {history.layer_names[i] for i in np.flatnonzero(last == STATUS_NONFINITE)}
    assert set(window.tree_model.flagged_layers()) == flagged


def test_opening_a_model_during_a_run_stops_it_and_loads(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["slow"])
    window.run()
    qtbot.waitUntil(lambda: window.history.count >= 1, timeout=RUN_TIMEOUT)
    with qtbot.waitSignal(window.model_loaded, timeout=LOAD_TIMEOUT):
        window.open_model(scripts["tiny"])
    assert window.state == "ready" and window.history.count == 0
    assert window.tree_model.watched_layers() == ["0", "2"]
    assert run_and_wait(qtbot, window, window.run).reason == "completed"
    assert window.history.count == 5


def test_events_panel_follows_a_history_that_lost_events(qtbot, window, scripts) -> None:
    open_and_wait(qtbot, window, scripts["nan"])
    run_and_wait(qtbot, window, window.run)
    assert window.events_panel.row_count() >= 2
    window.history.events.clear()
    window.history.first_nonfinite = None
    window._refresh()
    assert window.events_panel.row_count() == 0
    assert not window.events_panel.banner_area.isVisibleTo(window.events_panel)


def test_restart_keeps_clipping_off_over_a_config_clip(qtbot, window, tmp_path) -> None:
    script = tmp_path / "clipped.py"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "CONFIG = {'steps': 3, 'clip': 1.0, 'device': 'cpu'}\n"
        "def build_model():\n    return nn.Linear(3, 1)\n"
        "def make_batch(batch_size, device):\n"
        "    return torch.randn(batch_size, 3), torch.randn(batch_size, 1)\n"
    )
    open_and_wait(qtbot, window, str(script))
    assert window.settings_panel.settings().clip == 1.0
    window.settings_panel.clip_enabled.setChecked(False)
    with qtbot.waitSignal(window.model_loaded, timeout=LOAD_TIMEOUT):
        window.restart()
    assert window.settings_panel.settings().clip is None
    run_and_wait(qtbot, window, window.step)
    assert window.run_thread.worker.runner.settings.clip is None


def test_closing_during_a_slow_load_joins_the_thread(qtbot, window, tmp_path) -> None:
    script = tmp_path / "slow_build.py"
    script.write_text(
        "import time\nimport torch\nfrom torch import nn\n"
        "def build_model():\n    time.sleep(1.0)\n    return nn.Linear(3, 1)\n"
        "def make_batch(batch_size, device):\n"
        "    return torch.randn(batch_size, 3), torch.randn(batch_size, 1)\n"
    )
    window.open_model(str(script))
    assert window.state == "loading"
    qtbot.wait(200)
    window.close()
    assert not window.run_thread.thread.isRunning()


def test_refresh_timer_sleeps_until_the_next_redraw_is_due(window, monkeypatch) -> None:
    """During a fast run the GUI thread wakes when a redraw is due, not 30 times a second
    (each wake takes the GIL from the run thread)."""
    import time

    from gradscope.gui.main_window import REFRESH_INTERVAL_MS

    timer = window.refresh_timer
    assert timer.isSingleShot()
    window._dirty, window._paint_cpu_from = True, None
    window._next_refresh = time.perf_counter() + 0.6
    window._on_refresh_timer_timeout()  # not due yet: no redraw, sleeps until it is
    assert window._dirty and timer.isActive() and timer.interval() > 500
    window._dirty = False  # nothing to draw: steps may come any moment
    window._on_refresh_timer_timeout()
    assert timer.isActive() and timer.interval() == REFRESH_INTERVAL_MS
    window._dirty, window._next_refresh = True, 0.0
    window._on_refresh_timer_timeout()  # due: redraws, then a tick after the paint
    assert not window._dirty and window._paint_cpu_from is not None
    assert timer.isActive() and timer.interval() == REFRESH_INTERVAL_MS

    # A long wait armed while a run went on ends when the run pauses (idle share).
    window._paint_cpu_from = None
    window.state, window._dirty = "running", True
    window._redraw_cost, window._last_refresh = 0.2, time.perf_counter()
    window._schedule_next_refresh()
    window._on_refresh_timer_timeout()
    assert timer.interval() >= 4000  # 0.2 s of redraw at a 4% share
    window._set_state("paused")
    assert timer.interval() <= 1300  # at a sixth

    def broken() -> None:
        raise RuntimeError("a bug in a redraw")

    monkeypatch.setattr(window, "_redraw_if_due", broken)
    timer.stop()
    with pytest.raises(RuntimeError):
        window._on_refresh_timer_timeout()
    assert timer.isActive()  # a failed redraw never stops the redraws for good


def test_a_long_status_tip_gets_the_room_of_the_least_needed_fields(qtbot, window) -> None:
    """At 1280x800 the permanent fields cut the Run button's tip to "Run or continue up to
    the st": while a message shows, the recording's file (then the rewind memory, then
    steps/s) steps aside as far as the message needs, and comes back after it."""
    window.recordings.label.setText("recording to 20261202-172650-seed_explosion.gsrec")
    window.debugger.memory_label.setText("rewind: 5 step(s), 0.0 MB")
    window.step_label.setText("step: 9  (10 done)")
    window.loss_label.setText("loss: 1.71e+11")
    bar = window.statusBar()
    qtbot.wait(20)
    tip = window.run_action.statusTip()
    bar.showMessage(tip)
    qtbot.wait(20)
    assert not window.recordings.label.isVisible()
    assert window.loss_label.isVisible() and window.step_label.isVisible()
    shown = [w for w in (window.debugger.memory_label, window.rate_label, window.loss_label)
             if w.isVisible()]
    assert min(w.x() for w in shown) >= bar.fontMetrics().horizontalAdvance(tip)
    bar.clearMessage()
    qtbot.wait(20)
    assert window.recordings.label.isVisible()
    bar.showMessage("short")  # a message that fits moves nothing
    qtbot.wait(20)
    assert window.recordings.label.isVisible()
