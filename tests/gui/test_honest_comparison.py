"""Issue 38: compared runs drawn honestly, and views that follow what is shown."""

from __future__ import annotations

import numpy as np
from test_plots import _history, _view


def test_a_heatmap_of_one_layer_is_drawn(qtbot) -> None:
    from gradscope.gui.plots import HeatmapPlot

    names, history, _ = _history(layers=3, steps=30)
    heatmap = HeatmapPlot()
    qtbot.addWidget(heatmap)
    heatmap.resize(600, 400)
    heatmap.show()
    heatmap.refresh(_view(names, history, visible=[names[1]]))
    heatmap.image.render()
    image = heatmap.image.qimage
    assert image is not None and image.width() == 30 and image.height() >= 1
    # Each step's cell carries the colour computed for it (not blank).
    for step in (0, 17, 29):
        color = image.pixelColor(step, 0)
        assert (color.red(), color.green(), color.blue()) == tuple(heatmap.rgba[step, 0, :3])
