"""Errors a user can fix: each carries one clear message and, where useful, the lines of
the user's own traceback. Anything else escaping the engine is a GradScope bug."""

from __future__ import annotations

import re
from collections.abc import Sequence


class GradScopeError(Exception):
    """A problem with the user's input: a bad path, script, model name, setting or batch."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.details = list(details)

    def __str__(self) -> str:
        if not self.details:
            return self.message
        return self.message + "\n" + "\n".join(self.details)


class ModelScriptError(GradScopeError):
    """The user's model script failed: syntax error, exception, or a missing function."""


class SettingsError(GradScopeError):
    """A run setting is out of range or unknown."""


class BatchMismatchError(GradScopeError):
    """The batch does not fit the model (shape or dtype)."""


_ALLOCATION_FAILED = ("can't allocate memory", "not enough memory", "out of memory")


def out_of_memory(error: BaseException) -> str | None:
    """For an allocation that failed (CUDA's OutOfMemoryError, or CPU's "DefaultCPUAllocator:
    can't allocate memory: you tried to allocate N bytes"): a short account of it, e.g.
    "tried to allocate 894.1 GiB"; None for any other error."""
    text = str(error)
    if type(error).__name__ != "OutOfMemoryError" and not (
        isinstance(error, RuntimeError) and any(s in text.lower() for s in _ALLOCATION_FAILED)
    ):
        return None
    found = re.search(r"allocate (\d+) bytes", text)
    if found:
        return f"tried to allocate {_bytes(int(found.group(1)))}"
    found = re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]?i?B)", text)
    if found:
        return f"tried to allocate {found.group(1)}"
    return "out of memory"


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} bytes"
