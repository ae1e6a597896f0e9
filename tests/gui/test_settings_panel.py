"""The run settings panel and start-up defaults."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings

from gradscope.core.settings import RunSettings
from gradscope.gui.app import DEFAULT_SAMPLE, default_model
from gradscope.gui.settings_panel import SettingsPanel


def test_panel_round_trips_every_setting(qtbot) -> None:
    panel = SettingsPanel(cuda=[])
    qtbot.addWidget(panel)
    settings = RunSettings(device="cpu", steps=7, batch_size=3, optimizer="adamw", lr=1e-12,
                           momentum=0.5, weight_decay=0.01, loss_scale=5e10, clip=2.5, seed=4,
                           explode_threshold=1e4, vanish_threshold=1e-9, vanish_steps=5,
                           image_size=64, keep_going=True, update_ratio=True)
    panel.set_settings(settings)
    assert panel.settings() == settings
    panel.clip_enabled.setChecked(False)
    assert panel.settings().clip is None


def test_cuda_items_are_disabled_with_a_tooltip_when_absent(qtbot) -> None:
    panel = SettingsPanel(cuda=[])
    qtbot.addWidget(panel)
    item = panel.device.model().item(panel.device.findText("cuda:0"))
    assert not item.isEnabled() and "no CUDA" in item.toolTip()
    assert panel.device.model().item(panel.device.findText("cpu")).isEnabled()


def test_cuda_items_are_listed_per_device_when_present(qtbot) -> None:
    panel = SettingsPanel(cuda=["cuda:0", "cuda:1"])
    qtbot.addWidget(panel)
    for name in ("cuda:0", "cuda:1"):
        assert panel.device.model().item(panel.device.findText(name)).isEnabled()


def test_edits_are_announced_and_invalid_text_is_ignored(qtbot) -> None:
    panel = SettingsPanel(cuda=[])
    qtbot.addWidget(panel)
    panel.set_settings(RunSettings(device="cpu"))
    edited: list[RunSettings] = []
    panel.settings_edited.connect(edited.append)
    panel.lr.setText("not a number")
    panel.lr.editingFinished.emit()
    assert edited == [] and "fbd5d5" in panel.lr.styleSheet()
    panel.lr.setText("3e-4")
    panel.lr.editingFinished.emit()
    assert edited[-1].lr == 3e-4
    panel.seed.setValue(9)
    panel.seed.editingFinished.emit()
    assert edited[-1].seed == 9
    panel.set_settings(edited[-1], running=RunSettings(device="cpu"))
    assert panel.needs_restart() == ["seed"]
    assert "restart" in panel.restart_note.text()


def test_default_model_is_the_last_one_or_the_sample(tmp_path: Path) -> None:
    preferences = QSettings(str(tmp_path / "p.ini"), QSettings.Format.IniFormat)
    assert default_model(preferences) == str(DEFAULT_SAMPLE)
    script = tmp_path / "mine.py"
    script.write_text("")
    preferences.setValue("model/last", str(script))
    assert default_model(preferences) is None  # a user's script is offered, not run
    preferences.setValue("model/last", "resnet18")
    assert default_model(preferences) == "resnet18"  # a built-in name is reopened
    preferences.setValue("model/last", str(script))
    script.unlink()  # a last model that has gone falls back to the sample
    assert default_model(preferences) == str(DEFAULT_SAMPLE)


def _wheel(widget, steps: int) -> None:
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    center = QPointF(widget.width() / 2, widget.height() / 2)
    event = QWheelEvent(center, QPointF(widget.mapToGlobal(center.toPoint())), QPoint(0, 0),
                        QPoint(0, 120 * steps), Qt.MouseButton.NoButton,
                        Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def test_the_wheel_changes_a_value_only_in_the_focused_field(qtbot) -> None:
    panel = SettingsPanel(cuda=[])
    qtbot.addWidget(panel)
    panel.resize(360, 300)  # shorter than the form: the panel scrolls
    panel.show()
    panel.set_settings(RunSettings(image_size=224, optimizer="sgd"))
    edited = []
    panel.settings_edited.connect(edited.append)
    # Scrolling over the panel passes over the fields: none of them changes.
    for widget in (panel.image_size, panel.steps, panel.optimizer, panel.device):
        _wheel(widget, -5)
    assert panel.image_size.value() == 224 and panel.optimizer.currentText() == "sgd"
    assert panel.device.currentText() == "auto" and not edited
    # A field the user clicked into takes the wheel.
    panel.image_size.setFocus()
    qtbot.waitUntil(panel.image_size.hasFocus)
    _wheel(panel.image_size, 2)
    assert panel.image_size.value() == 226


def test_script_values_win_on_load_and_overrides_are_marked(qtbot, preferences, scripts) -> None:
    from gui_helpers import open_and_wait, run_and_wait

    from gradscope.gui.app import configure_plots
    from gradscope.gui.main_window import MainWindow

    configure_plots()
    first = MainWindow(preferences)
    qtbot.addWidget(first)
    open_and_wait(qtbot, first, scripts["nan"])  # CONFIG: lr 0.1, 20 steps, batch 16
    panel = first.settings_panel
    assert panel.overridden() == []
    assert not panel.reset_button.isEnabled()
    panel.lr.setText("0.001")
    panel.lr.editingFinished.emit()
    assert panel.overridden() == ["lr"]
    assert panel.reset_button.isEnabled()
    assert "0.1" in panel.lr.toolTip()  # the script's value is shown
    first.close()

    # Next launch: the script's lr, not the one the user tried last time.
    window = MainWindow(preferences)
    qtbot.addWidget(window)
    open_and_wait(qtbot, window, scripts["nan"])
    assert window.run_thread.worker.runner.settings.lr == 0.1
    panel = window.settings_panel
    assert panel.lr.value() == 0.1 and panel.overridden() == []
    offer = panel.last_overrides_button
    assert "lr" in offer.text() and offer.isVisibleTo(panel)
    # The user can take back last time's changes, marked as overrides...
    panel.last_overrides_button.click()
    assert panel.lr.value() == 0.001 and panel.overridden() == ["lr"]
    run_and_wait(qtbot, window, window.step)
    assert window.run_thread.worker.runner.settings.lr == 0.001
    # ...and reset them to the script's values.
    panel.reset_button.click()
    assert panel.lr.value() == 0.1 and panel.overridden() == []
    run_and_wait(qtbot, window, window.step)
    assert window.run_thread.worker.runner.settings.lr == 0.1
    window.close()
