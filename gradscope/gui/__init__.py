"""The GradScope desktop app (PySide6 + pyqtgraph). Everything Qt lives in this package."""

from gradscope.gui.pyside_compat import guard_singletons

guard_singletons()
