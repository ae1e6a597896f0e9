"""The architecture holds: the engine never imports Qt, the layout is as documented."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


QT_MODULES = ("PySide6", "pyqtgraph", "PyQt5", "PyQt6", "shiboken6")


def test_core_sources_do_not_import_qt():
    for path in sorted((REPO / "gradscope" / "core").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(QT_MODULES), f"{path.name} imports {name}"


def test_importing_engine_and_cli_loads_no_qt():
    code = (
        "import sys, gradscope.cli, gradscope.core.runner, gradscope.core.report, "
        "gradscope.core.history, gradscope.core.origin\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {QT_MODULES!r}]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_top_level_layout():
    for name in ("pyproject.toml", "README.md", "gradscope", "tests", "assets", "sample_models"):
        assert (REPO / name).exists(), name


OPTIONAL_LIBRARIES = ("transformers", "timm", "lightning", "pytorch_lightning", "accelerate")


def test_engine_cli_and_app_import_no_optional_library_unless_asked():
    # The extras (hf, timm, lightning) are imported by gradscope/core/zoo.py's functions and
    # gradscope/integrations only: never at the top of a module of the engine, CLI or app.
    for path in sorted((REPO / "gradscope").rglob("*.py")):
        if "integrations" in path.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in OPTIONAL_LIBRARIES, f"{path.name} imports {name}"
    # And at run time: loading a script, a torchvision model and the zoo module imports none.
    code = (
        "import sys, gradscope, gradscope.cli, gradscope.core.runner, gradscope.core.zoo, "
        "gradscope.integrations\n"
        "from gradscope.core.loading import load_with_settings\n"
        "load_with_settings('sample_models/seed_explosion.py')\n"
        "load_with_settings('resnet18')\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {OPTIONAL_LIBRARIES!r}]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
