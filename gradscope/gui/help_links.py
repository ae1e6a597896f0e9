"""Help where the user is: Help > Using the app opens the README's app section (the copy
next to the package, as in a checkout or an editable install)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl

README = Path(__file__).resolve().parents[2] / "README.md"
APP_SECTION = "the-app"  # the anchor of "## The app"


def app_section_url(readme: Path = README) -> QUrl | None:
    """The README's app section, or None where no README came with the package."""
    if not readme.is_file() or "\n## The app\n" not in readme.read_text(encoding="utf-8"):
        return None
    url = QUrl.fromLocalFile(str(readme))
    url.setFragment(APP_SECTION)
    return url
