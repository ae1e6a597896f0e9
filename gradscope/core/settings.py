"""Run settings: one dataclass shared by the CLI, the app and model scripts' ``CONFIG``."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from gradscope.core.errors import SettingsError

OPTIMIZERS = ("sgd", "adam", "adamw")
# Mixed precision: "" (off), "bf16" (autocast), "fp16" (autocast and a GradScaler).
AMP_MODES = ("", "bf16", "fp16")
_DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


@dataclass
class RunSettings:
    """Everything that shapes a run. ``clip=None`` means no gradient clipping."""

    device: str = "auto"
    steps: int = 50
    batch_size: int = 8
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    loss_scale: float = 1.0
    amp: str = ""
    amp_init_scale: float = 65536.0  # the GradScaler's first scale under fp16
    clip: float | None = None
    seed: int = 0
    explode_threshold: float = 1000.0
    vanish_threshold: float = 1e-7
    # Vanishing is a state: under the threshold for this many consecutive measured steps.
    vanish_steps: int = 3
    image_size: int = 224
    layers: list[str] | None = None
    keep_going: bool = False
    update_ratio: bool = False
    # max |g|, weight norm and update ratio every k-th step (1: every step; gradscope run and
    # the app are short diagnostic runs, so every step by default).
    detail_every: int = 1
    # The user's statistics, as MODULE:CLASS (gradscope.core.watch.statistic_loader).
    statistics: list[str] | None = None
    # Warn before a NaN/Inf (GradientWatch(early_warnings=True); gradscope.core.warnings).
    early_warnings: bool = False
    trace: bool = False
    rewind_depth: int = 0
    # hf: models: tokens per sequence; hf:/timm: models: config overrides (--config k=v).
    seq_len: int = 128
    model_config: dict[str, Any] | list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def validated(self) -> RunSettings:
        """Return self after checking every value; raise SettingsError naming the bad one."""
        problems = []
        if not _DEVICE_PATTERN.match(self.device):
            problems.append(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        if self.steps < 0:
            problems.append(f"steps must be >= 0, not {self.steps}")
        if self.batch_size < 1:
            problems.append(f"batch size must be >= 1, not {self.batch_size}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(
                f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {self.optimizer!r}"
            )
        for name in ("lr", "momentum", "weight_decay", "explode_threshold", "vanish_threshold"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                problems.append(
                    f"{name.replace('_', ' ')} must be a finite number >= 0, not {value}"
                )
        if self.amp not in AMP_MODES:
            problems.append(f"amp must be bf16, fp16 or empty (off), not {self.amp!r}")
        if not (math.isfinite(self.amp_init_scale) and self.amp_init_scale > 0):
            problems.append(f"amp init scale must be a positive number, not {self.amp_init_scale}")
        if not math.isfinite(self.loss_scale):
            problems.append(f"loss scale must be finite, not {self.loss_scale}")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            problems.append(f"clip must be a positive max norm, not {self.clip}")
        if self.vanish_steps < 1:
            problems.append(f"vanish steps must be >= 1, not {self.vanish_steps}")
        if self.detail_every < 1:
            problems.append(f"detail every must be >= 1, not {self.detail_every}")
        if not 0 <= self.rewind_depth <= 1000:
            problems.append(f"rewind depth must be 0..1000, not {self.rewind_depth}")
        if self.seq_len < 1:
            problems.append(f"sequence length must be >= 1, not {self.seq_len}")
        if self.image_size < 8:
            problems.append(f"image size must be >= 8, not {self.image_size}")
        if problems:
            raise SettingsError("bad run settings: " + "; ".join(problems))
        return self

    def replaced(self, **changes: Any) -> RunSettings:
        return dataclasses.replace(self, **changes).validated()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("extra")
        return data


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(RunSettings) if f.name != "extra")


def settings_from_config(config: dict[str, Any], base: RunSettings | None = None) -> RunSettings:
    """Apply a model script's ``CONFIG`` dict on top of ``base``; unknown keys are an error
    (a typo like ``"learning_rate"`` would otherwise be silently ignored)."""
    base = base or RunSettings()
    unknown = sorted(set(config) - set(SETTING_NAMES))
    if unknown:
        raise SettingsError(
            f"CONFIG has unknown setting(s) {', '.join(map(repr, unknown))}; "
            f"known settings: {', '.join(SETTING_NAMES)}"
        )
    try:
        return dataclasses.replace(base, **config).validated()
    except TypeError as error:
        raise SettingsError(f"bad CONFIG: {error}") from None
