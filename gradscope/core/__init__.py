"""The Qt-free engine: model loading, the module tree, the gradient watch, origin
localisation and the step runner. Nothing here may import PySide6 or pyqtgraph."""
