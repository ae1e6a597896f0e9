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
