"""The settings each step ran with, as changes: "lr 0.1 -> 0.001 from step 3".

The run's settings change while it goes on (a what-if while paused) and a rewind goes back
to before some steps. A view or a recording that showed only the start settings would
misstate the run: the window's Events list and the app's recordings note each change at the
first step that used it (a "settings" event), and forget the changes of a branch that a
rewind abandoned (the kept steps ran with the settings before them).
"""

from __future__ import annotations

from typing import Any

from gradscope.core.settings import SETTING_NAMES

# Not run settings a step "ran with": which layers are watched shows in the layers recorded.
_NOT_COMPARED = ("layers",)


def _text(name: str, value: Any) -> str:
    if name == "clip" and value is None:
        return "off"
    if isinstance(value, bool):  # keep going, update ratio, early warnings, trace
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe_change(before: Any, after: Any) -> str | None:
    """``lr 0.1 -> 0.001, clip off -> 1`` between two RunSettings; None when equal."""
    parts = []
    for name in SETTING_NAMES:
        if name in _NOT_COMPARED:
            continue
        old, new = getattr(before, name, None), getattr(after, name, None)
        if old != new:
            label = "keep going" if name == "keep_going" else name.replace("_", " ")
            parts.append(f"{label} {_text(name, old)} -> {_text(name, new)}")
    return ", ".join(parts) or None


class SettingsTrail:
    """The settings changes of a run, step by step (see the module docstring)."""

    def __init__(self, start: Any) -> None:
        self._trail: list[tuple[int, Any]] = [(-1, start)]

    @property
    def current(self) -> Any:
        return self._trail[-1][1]

    def note(self, step: int, settings: Any) -> str | None:
        """The change ``settings`` makes at ``step`` (then remembered), or None."""
        if settings is None or settings == self.current:
            return None
        change = describe_change(self.current, settings)
        self._trail.append((step, settings))
        if change is None:
            return None
        return f"from step {step}: {change}"

    def rewind(self, step: int) -> None:
        """Steps from ``step`` on are gone: so are the changes they brought."""
        self._trail = [entry for entry in self._trail if entry[0] < step] or self._trail[:1]
