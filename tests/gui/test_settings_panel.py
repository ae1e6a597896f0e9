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
                           explode_threshold=1e4, vanish_threshold=1e-9, image_size=64,
                           keep_going=True, update_ratio=True)
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
    assert default_model(preferences) == str(script)
    script.unlink()  # a last model that has gone falls back to the sample
    assert default_model(preferences) == str(DEFAULT_SAMPLE)
