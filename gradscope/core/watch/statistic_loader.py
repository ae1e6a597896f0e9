"""``--statistic MODULE:CLASS`` (``gradscope run``, ``gradscope attach``): a user's statistic
class by name, imported from the current folder or ``sys.path`` (or from a ``.py`` file),
with a one-line error for a spec that does not name one."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from gradscope.core.errors import GradScopeError
from gradscope.core.watch.statistics import Statistic


def _import(spec: str, module_name: str):
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise GradScopeError(f"--statistic {spec}: no file {module_name}")
        name = f"gradscope_statistics_{path.stem}"
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__file__", None) == str(path.resolve()):
            return loaded
        found = importlib.util.spec_from_file_location(name, path.resolve())
        module = importlib.util.module_from_spec(found)
        sys.modules[name] = module
        found.loader.exec_module(module)
        return module
    # As `python -m` would: the current folder first, so a statistics file beside the
    # script is found.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise GradScopeError(
                f"--statistic {spec}: no module {module_name!r} in the current folder or on "
                "sys.path"
            ) from None
        raise


def load_statistic_class(spec: str) -> type[Statistic]:
    """The :class:`gradscope.Statistic` subclass ``spec`` names (``MODULE:CLASS``, MODULE a
    dotted module name or a ``.py`` file); a GradScopeError of one line otherwise."""
    module_name, colon, class_name = str(spec).rpartition(":")
    if not colon or not module_name or not class_name.isidentifier():
        raise GradScopeError(
            f"--statistic {spec}: expected MODULE:CLASS, e.g. --statistic mystats:GradRMS"
        )
    try:
        module = _import(spec, module_name)
    except GradScopeError:
        raise
    except Exception as error:
        raise GradScopeError(
            f"--statistic {spec}: importing {module_name} raised {type(error).__name__}: {error}"
        ) from None
    found = getattr(module, class_name, None)
    if found is None:
        raise GradScopeError(f"--statistic {spec}: {module_name} has no {class_name}")
    if not (isinstance(found, type) and issubclass(found, Statistic)):
        raise GradScopeError(
            f"--statistic {spec}: {class_name} is not a subclass of gradscope.Statistic"
        )
    try:
        found()
    except Exception as error:
        raise GradScopeError(
            f"--statistic {spec}: {class_name}() raised {type(error).__name__}: {error} (a "
            "statistic is made without arguments)"
        ) from None
    return found


def load_statistics(specs: Iterable[str] | None) -> list[Statistic]:
    """One new instance of each statistic ``specs`` name (see :func:`load_statistic_class`)."""
    return [load_statistic_class(spec)() for spec in specs or ()]
