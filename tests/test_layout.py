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
        "gradscope.core.history, gradscope.core.origin, gradscope.core.invisible_rerun\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {QT_MODULES!r}]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_top_level_layout():
    for name in ("pyproject.toml", "README.md", "gradscope", "tests", "assets", "sample_models"):
        assert (REPO / name).exists(), name


OPTIONAL_LIBRARIES = (
    "transformers",
    "timm",
    "lightning",
    "pytorch_lightning",
    "accelerate",
    "tensorboard",
    "wandb",
)


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
        "from gradscope.core.sources import load_with_settings\n"
        "load_with_settings('sample_models/seed_explosion.py')\n"
        "load_with_settings('resnet18')\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {OPTIONAL_LIBRARIES!r}]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _gradscope_import_graph() -> dict[str, set[str]]:
    """Every gradscope module's imports of gradscope modules, wherever the import stands:
    at the top, inside a function, or under ``if TYPE_CHECKING:`` (a type-only import still
    ties the two files together)."""
    paths = {_module_name(p): p for p in (REPO / "gradscope").rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*kept, base] if base else kept)
                # ``from package import submodule`` imports the submodule.
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names
                ]
            else:
                continue
            for name in names:
                found = known(name)
                if found is not None and found != module:
                    targets.add(found)
                    targets.update(_packages_run_first(found, module, paths))
        graph[module] = targets
    return graph


def _packages_run_first(target: str, importer: str, paths: dict[str, Path]) -> list[str]:
    """The packages whose ``__init__`` runs when ``importer`` imports ``target``: each one
    above ``target`` that ``importer`` is not inside (its own packages have started already).
    ``gradscope.core.origin.kinds`` imported from ``gradscope.core.replay`` runs
    ``gradscope/core/origin/__init__.py`` first, and all that it imports."""
    parts = target.split(".")
    found = []
    for end in range(1, len(parts)):
        package = ".".join(parts[:end])
        if package in paths and not (importer + ".").startswith(package + "."):
            found.append(package)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_among_gradscope_modules():
    graph = _gradscope_import_graph()
    circles = _circles(graph)
    described = [
        "; ".join(f"{m} -> {sorted(graph[m] & set(circle))}" for m in circle) for circle in circles
    ]
    assert not circles, "import circles:\n" + "\n".join(described)


def test_the_circle_finder_sees_function_and_type_only_imports(tmp_path, monkeypatch):
    # The finder itself, on a package whose only circle runs through a function-level import
    # and a TYPE_CHECKING one.
    package = tmp_path / "gradscope"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from gradscope.b import g\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gradscope import a\n"
    )
    (package / "c.py").write_text("import gradscope.a\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert _circles(_gradscope_import_graph()) == [["gradscope.a", "gradscope.b"]]


def test_the_circle_finder_sees_a_package_init_run_by_a_submodule_import(tmp_path, monkeypatch):
    # Importing gradscope.pkg.leaf runs gradscope/pkg/__init__.py first; here that imports
    # gradscope.pkg.inner, which needs gradscope.other, the importer: a circle no import
    # statement names end to end (importing gradscope.other fails on it).
    package = tmp_path / "gradscope"
    (package / "pkg").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pkg" / "__init__.py").write_text("from gradscope.pkg.inner import f\n")
    (package / "pkg" / "inner.py").write_text("from gradscope.other import h\n\n\ndef f(): ...\n")
    (package / "pkg" / "leaf.py").write_text("def g(): ...\n")
    (package / "other.py").write_text("from gradscope.pkg.leaf import g\n\n\ndef h(): ...\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert _circles(_gradscope_import_graph()) == [
        ["gradscope.other", "gradscope.pkg", "gradscope.pkg.inner"]
    ]
    # A sibling's import inside the package runs no __init__ again: no circle of its own.
    (package / "other.py").write_text("def h(): ...\n")
    (package / "pkg" / "inner.py").write_text(
        "from gradscope.pkg.leaf import g\n\n\ndef f(): ...\n"
    )
    assert _circles(_gradscope_import_graph()) == []
