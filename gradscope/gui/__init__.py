"""The GradScope desktop app (PySide6 + pyqtgraph). Everything Qt lives in this package."""

# torch before PySide6: once PySide6 is imported, its import hook (shibokensupport's
# "feature" check) reads the source of every module imported after it, over a thousand of
# torch's, which cost 0.25-0.3 s of the app's launch here.
import torch  # noqa: F401

from gradscope.gui.pyside_compat import guard_singletons

guard_singletons()
