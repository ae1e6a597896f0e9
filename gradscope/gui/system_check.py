"""Before Qt starts on Linux: are the system libraries of Qt's X11 plugin there?

Qt 6's xcb platform plugin needs a few X libraries that a fresh Linux install may lack (most
often ``libxcb-cursor0``). Without them Qt aborts with its own message, which names one of
them and says nothing about how to get it. This check asks the dynamic loader (``ldd``) what
the plugin cannot find, names the Debian/Ubuntu packages and prints the command, before any Qt
code runs. It imports no Qt module.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Libraries Qt 6.5+ needs for X11, by soname: the usual suspects when ldd is not available.
KNOWN_XCB_LIBRARIES = ("xcb-cursor", "xcb-icccm", "xcb-keysyms", "xkbcommon-x11")
_NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.MULTILINE)


def debian_package(soname: str) -> str:
    """The Debian/Ubuntu package of a library: ``libxcb-cursor.so.0`` -> ``libxcb-cursor0``,
    ``libxkbcommon-x11.so.0`` -> ``libxkbcommon-x11-0`` (Debian's naming policy)."""
    match = re.match(r"^(lib[\w.+-]*?)\.so\.(\d+)", soname)
    if match is None:
        return soname
    name, version = match.groups()
    separator = "-" if name[-1].isdigit() else ""
    return f"{name}{separator}{version}".lower()


def not_found(ldd_output: str) -> list[str]:
    """The sonames ``ldd`` reported as "not found", once each, in order."""
    return list(dict.fromkeys(_NOT_FOUND.findall(ldd_output)))


def xcb_plugin() -> Path | None:
    """The xcb platform plugin of the installed PySide6, found without importing it."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        plugin = Path(folder) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.exists():
            return plugin
    return None


def missing_libraries(plugin: Path | None = None) -> list[str]:
    """Sonames the xcb plugin needs and the loader cannot find."""
    plugin = plugin or xcb_plugin()
    ldd = shutil.which("ldd")
    if plugin is not None and ldd is not None:
        try:
            result = subprocess.run(
                [ldd, str(plugin)], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.SubprocessError):
            pass
        else:
            return not_found(result.stdout)
    return [
        f"lib{name}.so.0"
        for name in KNOWN_XCB_LIBRARIES[:1]
        if ctypes.util.find_library(name) is None
    ]


def uses_xcb(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Qt will start its X11 plugin: Linux, and no other platform asked for or implied."""
    if not sys.platform.startswith("linux"):
        return False
    platform = environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0].split(";")[0] == "xcb"
    return not (environ.get("WAYLAND_DISPLAY") and not environ.get("DISPLAY"))


def startup_problem(
    environ: dict[str, str] | os._Environ[str] = os.environ, missing: list[str] | None = None
) -> str | None:
    """What to tell the user instead of starting Qt, or None when it can start."""
    if not uses_xcb(environ):
        return None
    missing = missing_libraries() if missing is None else missing
    if not missing:
        return None
    packages = " ".join(dict.fromkeys(debian_package(name) for name in missing))
    return (
        "GradScope cannot open its window: Qt's X11 support needs system libraries that are "
        f"not installed ({', '.join(missing)}).\n"
        f"On Debian or Ubuntu:  sudo apt-get install {packages}\n"
        "On Fedora:  sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms\n"
        "Without a display, `gradscope run MODEL` works headless, and "
        "QT_QPA_PLATFORM=offscreen gradscope MODEL --screenshot out.png saves the window."
    )
