"""The four plots, drawn from the engine's RunHistory (they never compute a statistic).

(1) gradient norm against step, one curve per ticked layer, log y; non-finite points are
markers pinned to the top edge and exact zeros to the bottom edge, so nothing is dropped by
the logarithm; (2) the loss; (3) a layers x steps heatmap of log10 gradient norm with NaN/Inf
in red; (4) gradient flow: one bar per layer at the selected step, coloured by status, with
the thresholds. Curves are created once per layer and then only fed with ``setData``.
Clicking any plot emits ``selection_made`` (layer and/or step); the window links them.

One widget per module; the caches they share (log10 norms, peak levels) apart.
"""

from __future__ import annotations

from gradscope.gui.plots.display_values import HEATMAP_MAX_COLUMNS, log10_display, reduce_steps
from gradscope.gui.plots.gradient_flow_plot import GradientFlowPlot
from gradscope.gui.plots.gradient_norm_plot import GradientNormPlot
from gradscope.gui.plots.heatmap_colors import SKIPPED_CELL, ZERO_RGBA
from gradscope.gui.plots.heatmap_plot import HeatmapPlot
from gradscope.gui.plots.layer_colors import layer_color
from gradscope.gui.plots.loss_plot import LossPlot
from gradscope.gui.plots.plot_panel import PlotPanel
from gradscope.gui.plots.plot_view import PlotView, classify_for_display

__all__ = [
    "HEATMAP_MAX_COLUMNS",
    "SKIPPED_CELL",
    "ZERO_RGBA",
    "GradientFlowPlot",
    "GradientNormPlot",
    "HeatmapPlot",
    "LossPlot",
    "PlotPanel",
    "PlotView",
    "classify_for_display",
    "layer_color",
    "log10_display",
    "reduce_steps",
]
