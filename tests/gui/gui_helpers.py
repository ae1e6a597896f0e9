"""Helpers shared by the GUI tests: open a model or run steps and wait for the window."""

from __future__ import annotations

LOAD_TIMEOUT = 30_000
RUN_TIMEOUT = 30_000


def open_and_wait(qtbot, window, source: str, **overrides) -> None:
    with qtbot.waitSignal(window.model_loaded, timeout=LOAD_TIMEOUT):
        window.open_model(source, overrides or None)


def run_and_wait(qtbot, window, action) -> object:
    with qtbot.waitSignal(window.run_paused, timeout=RUN_TIMEOUT) as blocker:
        action()
    return blocker.args[0]
