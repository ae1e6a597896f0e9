"""Other runs drawn on the same axes as the one shown (File > Add recording to compare,
``gradscope open A.gsrec B.gsrec``): each with its own line style, its layers matched to
the shown run's by name."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt

from gradscope.core.history import RunHistory

# The shown run is solid; compared runs take these in turn (a layer keeps its colour in
# every run, so the style tells the runs apart).
COMPARED_LINE_STYLES = (
    Qt.PenStyle.DashLine,
    Qt.PenStyle.DotLine,
    Qt.PenStyle.DashDotLine,
    Qt.PenStyle.DashDotDotLine,
)
LINE_STYLE_WORDS = {
    Qt.PenStyle.SolidLine: "solid",
    Qt.PenStyle.DashLine: "dashed",
    Qt.PenStyle.DotLine: "dotted",
    Qt.PenStyle.DashDotLine: "dash-dot",
    Qt.PenStyle.DashDotDotLine: "dash-dot-dot",
}


def short_run_name(name: str, limit: int = 22) -> str:
    """A run's (file) name in at most ``limit`` characters, cut in the middle: both its
    start and its end (often the part that differs) stay."""
    if len(name) <= limit:
        return name
    head = (limit - 1) // 2
    return f"{name[:head]}…{name[len(name) - (limit - 1 - head) :]}"


@dataclass(frozen=True)
class ComparedRun:
    """A run read from a recording, shown next to the current one."""

    name: str
    history: RunHistory
    line_style: Qt.PenStyle
    # What was shown when it was added (a model's source, a recording's path): a run
    # belongs to that model and leaves when another opens, unless the user pins the runs.
    made_on: str | None = None

    def missing_layers(self, layers: list[str]) -> list[str]:
        """Those of ``layers`` this run never recorded."""
        return [name for name in layers if not self.history.has_layer(name)]
