"""The start-up check for the system libraries Qt's X11 plugin needs (issue 15, defect 13)."""

from __future__ import annotations

from gradscope.gui import app, system_check

LDD_OUTPUT = """\
	linux-vdso.so.1 (0x00007ffd4f1f2000)
	libQt6XcbQpa.so.6 => /x/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f0e1c400000)
	libxcb-cursor.so.0 => not found
	libxcb-icccm.so.4 => not found
	libxkbcommon-x11.so.0 => not found
	libxcb-icccm.so.4 => not found
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0e1c000000)
"""


def test_not_found_libraries_and_their_debian_packages() -> None:
    missing = system_check.not_found(LDD_OUTPUT)
    assert missing == ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxkbcommon-x11.so.0"]
    assert [system_check.debian_package(m) for m in missing] == [
        "libxcb-cursor0",
        "libxcb-icccm4",
        "libxkbcommon-x11-0",
    ]


def test_the_message_says_what_to_install_only_when_x11_is_used() -> None:
    missing = ["libxcb-cursor.so.0", "libxcb-keysyms.so.1"]
    message = system_check.startup_problem({"DISPLAY": ":0"}, missing)
    assert message is not None
    assert "sudo apt-get install libxcb-cursor0 libxcb-keysyms1" in message
    assert system_check.startup_problem({"QT_QPA_PLATFORM": "offscreen"}, missing) is None
    assert system_check.startup_problem({"WAYLAND_DISPLAY": "wayland-0"}, missing) is None
    assert system_check.startup_problem({"DISPLAY": ":0"}, []) is None


def test_the_plugin_is_found_and_checked_on_this_machine() -> None:
    plugin = system_check.xcb_plugin()
    assert plugin is not None and plugin.name == "libqxcb.so"
    assert isinstance(system_check.missing_libraries(plugin), list)


def test_launch_prints_what_to_install_instead_of_starting_qt(monkeypatch, capsys) -> None:
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    monkeypatch.setattr(
        system_check, "missing_libraries", lambda plugin=None: ["libxcb-cursor.so.0"]
    )
    assert app.launch(None, {}) == 2  # a set-up problem (exit-code contract), not a bug
    assert "sudo apt-get install libxcb-cursor0" in capsys.readouterr().err
