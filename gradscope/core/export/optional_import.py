"""The optional packages an export needs, imported only when that export is asked for."""

from __future__ import annotations

import importlib
from types import ModuleType

from gradscope.core.errors import GradScopeError

# module -> (what it is for, the extra that installs it)
_EXTRAS = {
    "tensorboard": ("TensorBoard export", "tensorboard"),
    "wandb": ("W&B export", "wandb"),
}


def require(module: str) -> ModuleType:
    """Import ``module`` (a submodule of an optional package), or raise a
    :class:`GradScopeError` that says which ``pip install`` provides it."""
    package = module.split(".", 1)[0]
    purpose, extra = _EXTRAS[package]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise GradScopeError(
            f"{purpose} needs the {package} package ({error}): "
            f'pip install "gradscope[{extra}]" (or pip install {package})'
        ) from None
