"""The run settings panel: one widget per field of the engine's RunSettings.

Edits are announced with ``settings_edited``; the window hands them to the worker, which
applies them from the next step (a what-if while paused). The device, seed and image size
belong to the built model, so they take effect at the next restart; the panel says so.
"""

from __future__ import annotations

import dataclasses
import math
import re

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gradscope.core.settings import OPTIMIZERS, SETTING_NAMES, RunSettings
from gradscope.gui.worker import RESTART_SETTINGS

AMP_CHOICES = (
    ("off (float32)", ""),
    ("bf16 (autocast)", "bf16"),
    ("fp16 (autocast + GradScaler)", "fp16"),
)
_RESTART_WORDS = {
    "amp": "mixed precision",
    "amp_init_scale": "initial loss scale",
    "image_size": "image size",
}


def architecture_note(architecture: dict) -> str:
    """``{"task": "causal LM", "num_hidden_layers": 2, "parameters": 1234567}`` as one line:
    "Built: causal LM, num hidden layers 2, ..., 1.2M parameters"."""
    parts = []
    for key, value in architecture.items():
        if key == "parameters" and isinstance(value, (int, float)):
            continue
        parts.append(str(value) if key == "task" else f"{key.replace('_', ' ')} {value}")
    count = architecture.get("parameters")
    if isinstance(count, (int, float)):
        parts.append(f"{count / 1e6:,.1f}M parameters")
    return "Built: " + ", ".join(parts)


def cuda_devices() -> list[str]:
    """``cuda:N`` for each CUDA device present (none when torch has no usable GPU)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    except Exception:  # a broken CUDA set-up just means no CUDA items
        return []


class NumberEdit(QLineEdit):
    """A float in any notation (``1e-12``, ``0.9``); invalid text turns red and is ignored."""

    value_edited = Signal()

    def __init__(self, minimum: float = 0.0, allow_empty: bool = False) -> None:
        super().__init__()
        self.minimum = minimum
        self.allow_empty = allow_empty
        self.editingFinished.connect(self._on_editing_finished)
        self.textChanged.connect(self._on_text_changed)
        self._value: float | None = 0.0

    def value(self) -> float | None:
        return self._value

    def set_value(self, value: float | None) -> None:
        self._value = value
        self.setText("" if value is None else f"{value:g}")

    def _parse(self) -> tuple[bool, float | None]:
        text = self.text().strip()
        if not text:
            return self.allow_empty, None
        try:
            value = float(text)
        except ValueError:
            return False, None
        return math.isfinite(value) and value >= self.minimum, value

    def _on_text_changed(self) -> None:
        ok, _ = self._parse()
        self.setStyleSheet("" if ok else "QLineEdit { background: #fbd5d5; }")

    def _on_editing_finished(self) -> None:
        ok, value = self._parse()
        if ok and value != self._value:
            self._value = value
            self.value_edited.emit()


def _describe(values: dict[str, object]) -> str:
    """``lr 0.001, trace on``: values as the panel says them, not as Python prints them
    (it read "trace True")."""

    def said(value: object) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if value is None:
            return "off"
        return f"{value:g}" if isinstance(value, float) else str(value)

    return ", ".join(f"{name.replace('_', ' ')} {said(value)}" for name, value in values.items())


def _describe_names(names: set[str], order: dict[str, object]) -> str:
    return ", ".join(name.replace("_", " ") for name in order if name in names)


class _WheelOnlyWhenFocused(QObject):
    """Spin boxes and combo boxes take the mouse wheel only once the user clicked into them:
    scrolling the panel over them (to reach a field below) must not change values."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Wheel and not watched.hasFocus():
            event.ignore()  # the scroll area behind scrolls instead
            return True
        return False


class SettingsPanel(QScrollArea):
    settings_edited = Signal(object)  # RunSettings
    # "pause at the first warning" (the app's breakpoint, not a setting of the engine's run)
    pause_at_warning_toggled = Signal(bool)

    def __init__(self, cuda: list[str] | None = None) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        body = QWidget()
        self.setWidget(body)
        outer = QVBoxLayout(body)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        outer.addLayout(form)
        self._base = RunSettings()
        self._loading = False

        self.device = QComboBox()
        self._fill_devices(cuda_devices() if cuda is None else cuda)
        self.steps = QSpinBox()
        self.steps.setRange(0, 10_000_000)
        self.steps.setToolTip("steps a Run goes to (Run continues a paused run up to this)")
        self.batch_size = QSpinBox()
        self.batch_size.setRange(1, 1_000_000)
        self.optimizer = QComboBox()
        self.optimizer.addItems(OPTIMIZERS)
        self.lr = NumberEdit()
        self.momentum = NumberEdit()
        self.weight_decay = NumberEdit()
        self.loss_scale = NumberEdit(minimum=-math.inf)
        self.loss_scale.setToolTip(
            "the loss is multiplied by this (large values provoke\nexplosion)"
        )
        self.clip_enabled = QCheckBox("clip to")
        self.clip = NumberEdit(minimum=1e-300)
        self.clip.set_value(1.0)
        clip_row = QWidget()
        clip_layout = QHBoxLayout(clip_row)
        clip_layout.setContentsMargins(0, 0, 0, 0)
        clip_layout.addWidget(self.clip_enabled)
        clip_layout.addWidget(self.clip, 1)
        clip_row.setToolTip("clip the total gradient norm (off when unticked)")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.image_size = QSpinBox()
        self.image_size.setRange(8, 4096)
        self.image_size.setToolTip("input size for torchvision models")
        # Mixed precision belongs to the built run (the engine refuses to change it mid-run):
        # a change applies at the next restart, as the device does.
        self.amp = QComboBox()
        for label, value in AMP_CHOICES:
            self.amp.addItem(label, value)
        self.amp.setToolTip(
            "autocast the forward and the loss; fp16 adds a GradScaler\n"
            "(its skipped steps are shown in purple, not as NaN/Inf)"
        )
        self.amp_init_scale = NumberEdit(minimum=1e-300)
        self.amp_init_scale.setToolTip("the GradScaler's first loss scale (fp16 only)")
        self.explode_threshold = NumberEdit()
        self.explode_threshold.setToolTip("a layer whose gradient norm is above this is exploding")
        self.vanish_threshold = NumberEdit()
        self.vanish_threshold.setToolTip("a layer whose gradient norm is below this is vanishing")
        self.vanish_steps = QSpinBox()
        self.vanish_steps.setRange(1, 100000)
        self.vanish_steps.setSuffix(" steps")
        self.vanish_steps.setToolTip(
            "vanishing once a layer's gradient norm stays below the threshold this many "
            "measured steps in a row (a fresh model's first zero gradient is no alarm)"
        )
        self.pause_at_nonfinite = QCheckBox("pause at the first NaN/Inf")
        self.pause_at_nonfinite.setToolTip(
            "like a breakpoint: the step's optimizer update is not applied, so weights and "
            "gradients stay as they were (off: keep going)"
        )
        self.update_ratio = QCheckBox("measure update ratio ‖Δw‖/‖w‖")
        self.early_warnings = QCheckBox("early warnings (spiking, drifting, low headroom)")
        self.early_warnings.setToolTip(
            "warn before a NaN/Inf: a quantity spiking or drifting against its own history, "
            "or near its dtype's limits\n(adds each layer's output max |x| and RMS and the "
            "head's log-partition as forward statistics)"
        )
        self.pause_at_warning = QCheckBox("pause at the first warning")
        self.pause_at_warning.setToolTip(
            "stop the run after the step that brings its first early warning (Run goes on)"
        )
        self.pause_at_warning.setEnabled(False)
        # Newer engine settings, shown when the engine has them.
        self.trace = QCheckBox("trace forward/backward order") if "trace" in SETTING_NAMES else None
        self.rewind_depth = QSpinBox() if "rewind_depth" in SETTING_NAMES else None
        if self.trace is not None:
            self.trace.setToolTip("record the order of forward and backward events each step")
        if self.rewind_depth is not None:
            self.rewind_depth.setRange(0, 1000)
            self.rewind_depth.setToolTip(
                "steps the run can go back to (keeps a copy of the "
                "weights and optimizer state per step)"
            )

        restart = " ⟳"
        form.addRow("Device" + restart, self.device)
        form.addRow("Steps", self.steps)
        form.addRow("Batch size", self.batch_size)
        form.addRow("Optimizer", self.optimizer)
        form.addRow("Learning rate", self.lr)
        form.addRow("Momentum", self.momentum)
        form.addRow("Weight decay", self.weight_decay)
        form.addRow("Loss scale", self.loss_scale)
        form.addRow("Gradient clip", clip_row)
        form.addRow("Seed" + restart, self.seed)
        form.addRow("Image size" + restart, self.image_size)
        self._form = form
        form.addRow("Mixed precision" + restart, self.amp)
        form.addRow("Initial loss scale" + restart, self.amp_init_scale)
        form.addRow("Explode above", self.explode_threshold)
        form.addRow("Vanish below", self.vanish_threshold)
        form.addRow("Vanishing after", self.vanish_steps)
        form.addRow("", self.pause_at_nonfinite)
        form.addRow("", self.update_ratio)
        form.addRow("", self.early_warnings)
        form.addRow("", self.pause_at_warning)
        if self.trace is not None:
            form.addRow("", self.trace)
        if self.rewind_depth is not None:
            form.addRow("Rewind depth", self.rewind_depth)
        self.model_notes = QLabel("")
        self.model_notes.setWordWrap(True)
        self.model_notes.setStyleSheet("color: #a05a00;")
        self.model_notes.hide()
        outer.insertWidget(0, self.model_notes)
        self.read_only_note = QLabel(
            "The settings the recorded run started with (read-only); "
            "changes during the run are listed in Events."
        )
        self.read_only_note.setWordWrap(True)
        self.read_only_note.setStyleSheet("color: #444; font-weight: bold;")
        self.read_only_note.hide()
        outer.insertWidget(0, self.read_only_note)
        self.read_only = False
        self.form = form
        # Each setting's widget, for the marks of values that differ from the script's.
        self._fields: dict[str, QWidget] = {
            "device": self.device,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "lr": self.lr,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "loss_scale": self.loss_scale,
            "clip": clip_row,
            "seed": self.seed,
            "image_size": self.image_size,
            "amp": self.amp,
            "amp_init_scale": self.amp_init_scale,
            "explode_threshold": self.explode_threshold,
            "vanish_threshold": self.vanish_threshold,
            "vanish_steps": self.vanish_steps,
            "keep_going": self.pause_at_nonfinite,
            "update_ratio": self.update_ratio,
            "early_warnings": self.early_warnings,
        }
        if self.trace is not None:
            self._fields["trace"] = self.trace
        if self.rewind_depth is not None:
            self._fields["rewind_depth"] = self.rewind_depth
        self._tooltips = {name: widget.toolTip() for name, widget in self._fields.items()}
        self._script: RunSettings | None = None
        buttons = QHBoxLayout()
        self.reset_button = QPushButton("Reset to script defaults")
        self.reset_button.setToolTip(
            "Back to the values of the script's CONFIG (and the app's defaults under it)"
        )
        self.reset_button.setEnabled(False)
        self.reset_button.clicked.connect(self.reset_to_script)
        buttons.addWidget(self.reset_button)
        buttons.addStretch(1)
        outer.addLayout(buttons)
        self.overrides_note = QLabel("")
        self.overrides_note.setWordWrap(True)
        self.overrides_note.setStyleSheet("color: #1f5fb4;")
        outer.addWidget(self.overrides_note)
        self.last_overrides_button = QPushButton("")
        self.last_overrides_button.setToolTip(
            "Apply the values you changed the last time you used this model"
        )
        self.last_overrides_button.hide()
        self.last_overrides_button.clicked.connect(self._on_last_overrides_button_clicked)
        self._last_overrides: dict[str, object] = {}
        outer.addWidget(self.last_overrides_button)
        note = QLabel(
            "Changes apply from the next step, also while paused. "
            "⟳ marks settings that take effect at the next restart (Run ▸ Restart)."
        )
        note.setWordWrap(True)
        note.setStyleSheet("color: #666;")
        outer.addWidget(note)
        self.edit_note = note
        self.restart_note = QLabel("")
        self.restart_note.setWordWrap(True)
        self.restart_note.setStyleSheet("color: #a05a00;")
        outer.addWidget(self.restart_note)
        outer.addStretch(1)

        spins = self._spins()
        if self.trace is not None:
            self.trace.toggled.connect(self._on_widget_edited)
        for spin in spins:
            spin.editingFinished.connect(self._on_widget_edited)
            spin.valueChanged.connect(self._on_spin_changed)
        for edit in self._number_edits():
            edit.value_edited.connect(self._on_widget_edited)
        self.amp.currentIndexChanged.connect(self._on_amp_changed)
        for combo in (self.device, self.optimizer, self.amp):
            combo.currentIndexChanged.connect(self._on_widget_edited)
        for box in (
            self.clip_enabled,
            self.pause_at_nonfinite,
            self.update_ratio,
            self.early_warnings,
        ):
            box.toggled.connect(self._on_widget_edited)
        self.early_warnings.toggled.connect(self._on_early_warnings_toggled)
        self.pause_at_warning.toggled.connect(self.pause_at_warning_toggled)
        self.clip_enabled.toggled.connect(self.clip.setEnabled)
        self._wheel_filter = _WheelOnlyWhenFocused(self)
        for widget in (*self._spins(), self.device, self.optimizer, self.amp):
            widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # not WheelFocus
            widget.installEventFilter(self._wheel_filter)
        self._running_settings: RunSettings | None = None
        self._last_emitted: RunSettings | None = None
        # Until a model has loaded: the engine's defaults, not the widgets' minimums
        # ("Steps 0, Image size 8" looked like the model's settings).
        self.set_settings(RunSettings())

    def _fill_devices(self, cuda: list[str]) -> None:
        self.device.addItem("auto")
        self.device.addItem("cpu")
        names = cuda or ["cuda:0"]
        model = self.device.model()
        assert isinstance(model, QStandardItemModel)
        for name in names:
            self.device.addItem(name)
            if not cuda:
                item = model.item(self.device.count() - 1)
                item.setEnabled(False)
                item.setToolTip("no CUDA device here (CPU-only torch build or no usable GPU)")
        self.device.setToolTip("CUDA devices present: " + (", ".join(cuda) if cuda else "none"))

    # -- values --------------------------------------------------------------------------
    def set_settings(self, settings: RunSettings, running: RunSettings | None = None) -> None:
        """Show ``settings`` (no signal). ``running``: what the built model was made with."""
        self._loading = True
        try:
            if self.device.findText(settings.device) < 0:
                self.device.addItem(settings.device)
            self.device.setCurrentText(settings.device)
            self.steps.setValue(settings.steps)
            self.batch_size.setValue(settings.batch_size)
            self.optimizer.setCurrentText(settings.optimizer)
            self.lr.set_value(settings.lr)
            self.momentum.set_value(settings.momentum)
            self.weight_decay.set_value(settings.weight_decay)
            self.loss_scale.set_value(settings.loss_scale)
            self.clip_enabled.setChecked(settings.clip is not None)
            self.clip.setEnabled(settings.clip is not None)
            if settings.clip is not None:
                self.clip.set_value(settings.clip)
            self.seed.setValue(settings.seed)
            self.image_size.setValue(settings.image_size)
            self.amp.setCurrentIndex(max(0, self.amp.findData(settings.amp)))
            self.amp_init_scale.set_value(settings.amp_init_scale)
            self._on_amp_changed()
            self.explode_threshold.set_value(settings.explode_threshold)
            self.vanish_threshold.set_value(settings.vanish_threshold)
            self.vanish_steps.setValue(settings.vanish_steps)
            self.pause_at_nonfinite.setChecked(not settings.keep_going)
            self.update_ratio.setChecked(settings.update_ratio)
            self.early_warnings.setChecked(settings.early_warnings)
            self._on_early_warnings_toggled(settings.early_warnings)
            if self.trace is not None:
                self.trace.setChecked(bool(getattr(settings, "trace", False)))
            if self.rewind_depth is not None:
                self.rewind_depth.setValue(int(getattr(settings, "rewind_depth", 0)))
            self._base = settings
            if running is not None:
                self._running_settings = running
            self._update_restart_note()
            self._update_override_marks()
        finally:
            self._loading = False

    def settings(self) -> RunSettings:
        """The panel's values as RunSettings (layers as last set, kept from the base)."""
        newer: dict[str, object] = {}
        if self.trace is not None:
            newer["trace"] = self.trace.isChecked()
        if self.rewind_depth is not None:
            newer["rewind_depth"] = self.rewind_depth.value()
        return dataclasses.replace(
            self._base,
            **newer,
            device=self.device.currentText(),
            steps=self.steps.value(),
            batch_size=self.batch_size.value(),
            optimizer=self.optimizer.currentText(),
            lr=self.lr.value() or 0.0,
            momentum=self.momentum.value() or 0.0,
            weight_decay=self.weight_decay.value() or 0.0,
            loss_scale=self.loss_scale.value() if self.loss_scale.value() is not None else 1.0,
            clip=self.clip.value() if self.clip_enabled.isChecked() else None,
            seed=self.seed.value(),
            image_size=self.image_size.value(),
            amp=str(self.amp.currentData() or ""),
            amp_init_scale=self.amp_init_scale.value() or self._base.amp_init_scale,
            explode_threshold=self.explode_threshold.value() or 0.0,
            vanish_threshold=self.vanish_threshold.value() or 0.0,
            vanish_steps=self.vanish_steps.value(),
            keep_going=not self.pause_at_nonfinite.isChecked(),
            update_ratio=self.update_ratio.isChecked(),
            early_warnings=self.early_warnings.isChecked(),
        )

    # -- the script's values and the user's overrides ------------------------------------
    def set_script_defaults(
        self, script: RunSettings | None, last_overrides: dict[str, object] | None = None
    ) -> None:
        """The script's own values (its CONFIG over the app's defaults): values that differ
        are marked as the user's. ``last_overrides``: what the user changed the last time
        this model was used, offered (never applied by itself)."""
        self._script = script
        self._last_overrides = {}
        if script is not None and last_overrides:
            current = self.settings()
            self._last_overrides = {
                name: value
                for name, value in last_overrides.items()
                if getattr(current, name, value) != value
            }
        if self._last_overrides:
            self.last_overrides_button.setText(
                "Use my last changes: " + _describe(self._last_overrides)
            )
        self.last_overrides_button.setVisible(bool(self._last_overrides))
        self._update_override_marks()

    def overridden(self) -> list[str]:
        """The settings whose value is not the script's, in the panel's order."""
        script = self._script
        if script is None:
            return []
        current = self.settings()
        return [name for name in self._fields if getattr(current, name) != getattr(script, name)]

    def reset_to_script(self) -> None:
        if self._script is None or self.read_only:
            return
        self.set_settings(dataclasses.replace(self._script, layers=self._base.layers))
        self._on_widget_edited()

    def _on_last_overrides_button_clicked(self) -> None:
        overrides, self._last_overrides = self._last_overrides, {}
        self.last_overrides_button.hide()
        try:
            settings = dataclasses.replace(self.settings(), **overrides).validated()
        except Exception:  # stale stored values: nothing to apply
            return
        self.set_settings(settings)
        self._on_widget_edited()

    def _update_override_marks(self) -> None:
        changed = set(self.overridden())
        script = self._script
        for name, widget in self._fields.items():
            label = self.form.labelForField(widget)
            mark = name in changed
            style = "font-weight: bold; color: #1f5fb4;" if mark else ""
            if label is not None:
                label.setStyleSheet(style)
            elif isinstance(widget, QCheckBox):
                widget.setStyleSheet(style)
            tip = self._tooltips.get(name, "")
            if mark and script is not None:
                value = getattr(script, name)
                if name == "keep_going":
                    value = "off" if value else "on"
                tip = (tip + "\n" if tip else "") + f"changed by you; the script's value: {value}"
            widget.setToolTip(tip)
        self.reset_button.setEnabled(bool(changed) and not self.read_only)
        self.overrides_note.setText(
            f"Changed from the script (blue): {_describe_names(changed, self._fields)}"
            if changed
            else ""
        )

    def set_notes(self, notes: list[str], architecture: dict | None = None) -> None:
        """What the loader or the app chose for this model (an image size it needs, CPU
        defaults, a transformers config scaled down), shown above the settings;
        ``architecture``: an hf:/timm: model's sizes as built (LoadedModel.architecture)."""
        # A script's docstring is reStructuredText: ``torch.log`` reads torch.log here.
        notes = [re.sub(r"``(.+?)``", r"\1", note) for note in notes]
        if architecture:
            notes.append(architecture_note(architecture))
        self.model_notes.setText("\n".join(notes))
        self.model_notes.setVisible(bool(notes))

    def set_image_size_applies(self, applies: bool) -> None:
        """Offer Image size only for models fed random images (torchvision and timm names);
        a script makes its own batches, a recording has none."""
        self._form.setRowVisible(self.image_size, applies)

    def set_read_only(self, read_only: bool) -> None:
        """Show a recorded run's settings: visible, greyed, nothing to edit or apply (the
        model loaded before offered its last changes)."""
        self.read_only = read_only
        for edit in (
            *self._number_edits(),
            *self._spins(),
        ):
            edit.setReadOnly(read_only)
            edit.setEnabled(not read_only)
        if read_only:
            self.set_script_defaults(None)
            self.reset_button.setEnabled(False)
        for widget in (
            self.device,
            self.optimizer,
            self.amp,
            self.clip_enabled,
            self.pause_at_nonfinite,
            self.update_ratio,
            self.early_warnings,
            self.trace,
        ):
            if widget is not None:
                widget.setEnabled(not read_only)
        self.pause_at_warning.setEnabled(not read_only and self.early_warnings.isChecked())
        if not read_only:
            self.clip.setEnabled(self.clip_enabled.isChecked())
            self._on_amp_changed()
        self.read_only_note.setVisible(read_only)
        self.edit_note.setVisible(not read_only)
        if read_only:
            self.restart_note.setText("")

    def _number_edits(self) -> list[NumberEdit]:
        return [
            self.lr,
            self.momentum,
            self.weight_decay,
            self.loss_scale,
            self.clip,
            self.explode_threshold,
            self.vanish_threshold,
            self.amp_init_scale,
        ]

    def _spins(self) -> list[QSpinBox]:
        spins = [self.steps, self.batch_size, self.seed, self.image_size, self.vanish_steps]
        if self.rewind_depth is not None:
            spins.append(self.rewind_depth)
        return spins

    def set_layers(self, layers: list[str] | None) -> None:
        self._base = dataclasses.replace(self._base, layers=layers)

    def needs_restart(self) -> list[str]:
        running = self._running_settings
        if running is None:
            return []
        current = self.settings()
        return [
            name
            for name in RESTART_SETTINGS
            if getattr(current, name) != getattr(running, name)
            and not (name == "device" and current.device == "auto")
            and not (name == "amp_init_scale" and current.amp != "fp16")
        ]

    def _update_restart_note(self) -> None:
        changed = self.needs_restart()
        words = [_RESTART_WORDS.get(name, name.replace("_", " ")) for name in changed]
        self.restart_note.setText(
            f"{', '.join(words)} changed: restart to use the new value (Run ▸ Restart starts "
            "a new run; the run so far keeps the old one)."
            if changed
            else ""
        )

    def _on_amp_changed(self, *_: object) -> None:
        # The initial scale is the GradScaler's: only fp16 has one.
        self.amp_init_scale.setEnabled(self.amp.currentData() == "fp16")

    def _on_early_warnings_toggled(self, checked: bool) -> None:
        # Without warnings there is nothing to pause at: the box stays as set, unoffered.
        self.pause_at_warning.setEnabled(checked and not self.read_only)

    # -- edits ---------------------------------------------------------------------------
    def _on_spin_changed(self) -> None:
        # Arrow clicks change a spin box without finishing an edit.
        if not self._loading and not self.sender().hasFocus():
            self._on_widget_edited()

    def _on_widget_edited(self) -> None:
        if self._loading or self.read_only:
            return
        try:
            settings = self.settings().validated()
        except Exception:  # an invalid value is shown red, not applied
            return
        self._base = settings
        self._update_restart_note()
        self._update_override_marks()
        if settings != self._last_emitted:
            self._last_emitted = settings
            self.settings_edited.emit(settings)
