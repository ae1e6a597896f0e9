"""The status tooltip text says what a status means, why when the engine says, and nothing
for a layer no step measured."""

from __future__ import annotations

from gradscope.core.watch import STATUS_NAMES, STATUS_SKIPPED, STATUS_VANISHING
from gradscope.gui.status_style import status_tooltip


def test_every_status_has_a_meaning_and_unmeasured_has_none():
    for code in range(len(STATUS_NAMES)):
        assert "a status of the engine" not in status_tooltip(code), STATUS_NAMES[code]
    assert status_tooltip(None) == "no status: no step measured this layer yet"


def test_vanishing_says_when_it_is_set_and_why_and_skipped_is_only_the_scaler():
    why = "layer1.0.bn2.weight after it in its block is exactly 0"
    text = status_tooltip(STATUS_VANISHING, why)
    assert text.startswith("vanishing: ") and "3 consecutive measured steps" in text
    assert text.endswith("Why: " + why)
    assert "never skipped" in status_tooltip(STATUS_SKIPPED)


def test_the_tree_tooltip_of_a_vanishing_layer_says_why_when_the_engine_saw_it():
    from PySide6.QtCore import Qt
    from torch import nn

    from gradscope.core.module_tree import build_module_tree
    from gradscope.gui.module_tree_model import ModuleTreeModel

    model = ModuleTreeModel()
    model.set_tree(build_module_tree(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))), ["0", "1"])
    why = "0.gamma after it in its block is at most 1e-09"
    model.set_step_values(
        {"0": 1e-12, "1": 1e-12}, {"0": STATUS_VANISHING, "1": STATUS_VANISHING}, {"0": why}
    )
    root = model.index(0, 0)
    tips = [model.data(model.index(row, 0, root), Qt.ItemDataRole.ToolTipRole) for row in (0, 1)]
    assert tips[0].endswith("Why: " + why)
    assert "Why:" not in tips[1] and "vanishing: " in tips[1]
