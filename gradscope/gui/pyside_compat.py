"""A guard against a reference-count bug of PySide6 6.12.0 on Python 3.11.

Measured here (PySide6 6.12.0, Python 3.11.7): every call of a Qt method that returns
nothing (``QWidget.update()``, ``QLabel.setText()``, ``QSortFilterProxyModel.invalidate()``,
...) drops one reference to ``None`` without having taken it. PySide6 6.11.2 does not. From
Python 3.12 on ``None`` is immortal (PEP 683) and the bug is harmless; on 3.11 the count
reaches zero after enough calls and the interpreter aborts with "Fatal Python error:
none_dealloc: deallocating None" (in a long session, or when a test run exits).

When the bug is detected, :func:`guard_singletons` gives ``None``, ``True`` and ``False``
the effectively-immortal reference count that Python 3.12 gives them. Those objects are
static singletons that are never freed, so a larger count changes nothing else. Pinning
``PySide6-Essentials!=6.12.0`` avoids the need for it.
"""

from __future__ import annotations

import ctypes
import sys

_IMMORTAL_EXTRA = 1 << 40
_PROBE_CALLS = 64
_guarded = False


def leaks_none_references() -> bool:
    """True when PySide6's void methods drop references to None (the 6.12.0 bug)."""
    if sys.version_info >= (3, 12):
        return False
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(_PROBE_CALLS):
        probe.setObjectName("probe")
    lost = before - sys.getrefcount(None)
    return lost >= _PROBE_CALLS * 3 // 4


def is_guarded() -> bool:
    """The guard raised the singletons' counts in this process."""
    return _guarded


def guard_singletons() -> bool:
    """Make None, True and False effectively immortal if this PySide6 needs it; True when
    the guard is (or already was) in place."""
    global _guarded
    if _guarded:
        return True
    if not leaks_none_references():
        return False
    for singleton in (None, True, False):
        # ob_refcnt is the first field of every object in CPython's (non-debug) layout.
        ctypes.c_ssize_t.from_address(id(singleton)).value += _IMMORTAL_EXTRA
    _guarded = True
    return True
