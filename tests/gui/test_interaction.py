"""Hover, drag and drop, menus, dialogs, and a UI that stays responsive during slow steps."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QTimer, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent

from gradscope.gui.dialogs import TorchvisionDialog, versions_text
from gradscope.gui.main_window import SAMPLE_DIR

ONE_SECOND_STEPS = '''
import time
import torch
from torch import nn

CONFIG = {"steps": 50, "batch_size": 2, "device": "cpu"}


class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x):
        time.sleep(1.0)
        return self.fc(x)


def build_model():
    return Sleepy()


def make_batch(batch_size, device):
    return torch.randn(batch_size, 3, device=device), torch.randn(batch_size, 1, device=device)
'''


def load(qtbot, window, source: str) -> None:
    with qtbot.waitSignal(window.model_loaded, timeout=30_000):
        window.open_model(source)


def run(qtbot, window, action=None) -> object:
    with qtbot.waitSignal(window.run_paused, timeout=30_000) as blocker:
        (action or window.run)()
    return blocker.args[0]


def test_hover_names_layer_step_and_value(qtbot, window, scripts) -> None:
    load(qtbot, window, scripts["tiny"])
    run(qtbot, window)
    window._refresh()
    window.grab()  # the first paint settles the plots' ranges
    plot = window.plots.gradient_norm
    value = float(window.history.series("grad_norm", "2")[3])
    scene_pos = plot.item.vb.mapViewToScene(QPointF(3, math.log10(value)))
    found = plot.nearest(scene_pos)
    assert found is not None and found[0] == "2" and found[1] == 3
    assert math.isclose(found[2], value, rel_tol=1e-6)
    plot._on_scene_mouse_moved(scene_pos)
    assert plot.hover_text.startswith("2\nstep 3\n")


def test_hover_on_an_edge_marker_names_the_nonfinite_value(qtbot, window, scripts) -> None:
    load(qtbot, window, scripts["nan"])
    run(qtbot, window)
    window._refresh()
    window.grab()
    plot = window.plots.gradient_norm
    spot = plot.markers.points()[0]
    found = plot.nearest(plot.item.vb.mapViewToScene(spot.pos()))
    assert found is not None and found[1] == 2 and not math.isfinite(found[2])


def test_ui_stays_responsive_during_a_slow_step(qtbot, window, tmp_path: Path) -> None:
    script = tmp_path / "sleepy.py"
    script.write_text(ONE_SECOND_STEPS)
    load(qtbot, window, str(script))
    window.run()
    qtbot.waitUntil(lambda: window.history.count >= 1, timeout=10_000)
    latencies = []
    for _ in range(5):
        fired: list[float] = []
        started = time.perf_counter()
        QTimer.singleShot(0, lambda fired=fired: fired.append(time.perf_counter()))
        qtbot.waitUntil(lambda fired=fired: bool(fired), timeout=2_000)
        latencies.append(fired[0] - started)
        qtbot.wait(100)
    assert max(latencies) < 0.25
    started = time.perf_counter()
    paused = run(qtbot, window, window.stop)
    assert paused.reason == "stopped"
    assert time.perf_counter() - started < 2.5  # within one step


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # QDragEnterEvent(QPoint, ...)
def test_dropping_a_script_opens_it(qtbot, window, scripts) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(scripts["tiny"])])
    enter = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.CopyAction, mime,
                            Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dragEnterEvent(enter)
    assert enter.isAccepted()
    drop = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime,
                      Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.model_loaded, timeout=30_000):
        window.dropEvent(drop)
    assert window.source == scripts["tiny"]


def test_samples_menu_lists_the_sample_scripts(window) -> None:
    window._fill_samples_menu()
    tips = {action.toolTip() for action in window.samples_menu.actions()}
    expected = {str(p) for p in SAMPLE_DIR.glob("*.py") if not p.name.startswith("_")}
    assert expected and tips == expected


def test_run_menu_has_the_debugger_shortcuts(window) -> None:
    shortcuts = {action.text().replace("&", ""): action.shortcut().toString()
                 for action in (window.run_action, window.pause_action, window.step_action,
                                window.stop_action)}
    assert shortcuts == {"Run": "F5", "Pause": "F6", "Step": "F10", "Stop": "Shift+F5"}


def test_torchvision_dialog_filters_names(qtbot) -> None:
    dialog = TorchvisionDialog(None, ["alexnet", "resnet18", "resnet50", "vit_b_16"])
    qtbot.addWidget(dialog)
    dialog.search.setText("resnet")
    visible = [dialog.list.item(i).text() for i in range(dialog.list.count())
               if not dialog.list.item(i).isHidden()]
    assert visible == ["resnet18", "resnet50"]
    assert dialog.selected_name() == "resnet18"


def test_about_lists_torch_and_qt_versions() -> None:
    import torch

    text = versions_text()
    assert f"torch {torch.__version__}" in text and "Qt 6." in text


def test_a_real_click_on_a_curve_selects_its_tree_row_and_step(qtbot, window, scripts) -> None:
    load(qtbot, window, scripts["tiny"])
    run(qtbot, window)
    window._refresh()
    window.grab()
    plot = window.plots.gradient_norm
    value = float(window.history.series("grad_norm", "2")[3])
    scene_pos = plot.item.vb.mapViewToScene(QPointF(3, math.log10(value)))
    view_pos = plot.widget.mapFromScene(scene_pos)
    qtbot.mouseClick(plot.widget.viewport(), Qt.MouseButton.LeftButton, pos=view_pos)
    qtbot.waitUntil(lambda: window.selected_layer == "2", timeout=2_000)
    assert window.selected_step == 3
    current = window.tree_proxy.mapToSource(window.tree_view.currentIndex())
    assert window.tree_model.node(current).name == "2"


def test_real_clicks_on_a_heatmap_cell_and_a_bar_select_layer_and_step(
    qtbot, window, scripts
) -> None:
    load(qtbot, window, scripts["tiny"])
    run(qtbot, window)
    window._refresh()
    window.grab()
    heatmap = window.plots.heatmap
    pos = heatmap.widget.mapFromScene(heatmap.item.vb.mapViewToScene(QPointF(1, 0)))
    qtbot.mouseClick(heatmap.widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    qtbot.waitUntil(lambda: (window.selected_layer, window.selected_step) == ("0", 1),
                    timeout=2_000)
    window._refresh()
    window.grab()
    flow = window.plots.flow
    assert flow.step == 1
    pos = flow.widget.mapFromScene(flow.item.vb.mapViewToScene(QPointF(0, 1)))
    qtbot.mouseClick(flow.widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    qtbot.waitUntil(lambda: window.selected_layer == "2", timeout=2_000)
    assert window.selected_step == 1
