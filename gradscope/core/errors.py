"""Errors a user can fix: each carries one clear message and, where useful, the lines of
the user's own traceback. Anything else escaping the engine is a GradScope bug."""

from __future__ import annotations

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
