"""What the plots are asked to show (PlotView), and a trace value's status colour."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PySide6.QtGui import QColor

from gradscope.core.history import MISSING, STATUS_MISSING, RunHistory
from gradscope.core.watch import classify
from gradscope.gui.plots.compared_runs import ComparedRun


@dataclass
class PlotView:
    """What the plots show: the history, layers in forward order, the ticked ones and the
    current selection."""

    history: RunHistory
    order: list[str]
    visible: set[str]
    selected_layer: str | None = None
    selected_step: int | None = None
    explode_threshold: float = 1000.0
    vanish_threshold: float = 1e-7
    colors: dict[str, QColor] = field(default_factory=dict)
    # While a traced backward pass is walked: each layer's gradient norm so far (layers not
    # reached yet are absent), shown by the gradient-flow chart instead of the step's row.
    flow: dict[str, float] | None = None
    flow_title: str | None = None
    # Steps are arriving (a run is going on).
    live: bool = False
    # The shown run's name (the run legend's first entry) and other runs on the same axes.
    run_name: str = ""
    compared: tuple[ComparedRun, ...] = ()
    # What to do to get steps, shown over the empty plots ("" shows nothing).
    empty_hint: str = ""

    def ticked_layers(self) -> list[str]:
        """The ticked layers the history has, in forward order: what every plot shows (an
        unticked layer left the heatmap and the flow chart too)."""
        return [n for n in self.order if n in self.visible and self.history.has_layer(n)]


def classify_for_display(value: float, view: PlotView) -> int:
    """A trace value's status colour, with the engine's rule (watch.classify)."""
    if value == MISSING:
        return STATUS_MISSING
    return int(
        classify(np.array([value]), np.zeros(1), view.explode_threshold, view.vanish_threshold)[0]
    )
