"""The window's controllers are handed the widgets and signals they use, so that none of
them imports the window's module (issue 23: gui/main_window <-> its controllers was an
import circle, hidden behind TYPE_CHECKING)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GUI = Path(__file__).resolve().parents[2] / "gradscope" / "gui"


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize(
    "module", ["rank_set_view.py", "run_comparison.py", "step_debugger.py", "recordings.py"]
)
def test_controller_does_not_import_the_window(module: str) -> None:
    assert "gradscope.gui.main_window" not in _imported_modules(GUI / module)
