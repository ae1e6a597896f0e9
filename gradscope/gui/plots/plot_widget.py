"""The plot widget every plot starts from (grid axes behind the data, no buttons), and
what several plots share."""

from __future__ import annotations

import pyqtgraph as pg
import pyqtgraph.exporters

from gradscope.gui.plot_axes import GridAxis

DOTS_UP_TO = 40
LEFT_AXIS_WIDTH = 64


def _without_broken_svg_export() -> None:
    """Take pyqtgraph's SVG exporter out of its export dialog (right-click > Export...): in
    pyqtgraph 0.14 under Qt 6.12 it fails on every plot (it parses path data in a form this
    Qt no longer writes; pyqtgraph issue #3485). File > Export plots as SVG renders the plots
    through Qt's own QSvgGenerator instead."""
    exporters = pg.exporters.Exporter.Exporters
    if pg.exporters.SVGExporter in exporters:
        exporters.remove(pg.exporters.SVGExporter)


_without_broken_svg_export()


def make_plot_widget(
    title: str,
    grid_x: bool = True,
    grid_y: bool = True,
    left: GridAxis | None = None,
    view_box: pg.ViewBox | None = None,
) -> pg.PlotWidget:
    axes = {"left": left or GridAxis("left"), "bottom": GridAxis("bottom")}
    widget = pg.PlotWidget(axisItems=axes, viewBox=view_box)
    widget.setTitle(title, size="10pt")
    item = widget.getPlotItem()
    item.showGrid(x=grid_x, y=grid_y, alpha=0.15)
    item.hideButtons()
    for axis in axes.values():
        axis.enableAutoSIPrefix(False)
        axis.place_behind_data()
    widget.setMinimumSize(200, 150)
    return widget
