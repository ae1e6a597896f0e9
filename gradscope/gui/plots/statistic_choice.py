"""Which of the engine's per-layer statistics a plot shows, and the selector that picks it.

The history holds every statistic the watch measures per layer (gradient norm on every step;
max |g|, weight norm and update ratio on detail steps only); the plots draw whichever is
chosen. Detail-only statistics are drawn as the points they are: a step without detail is
MISSING, and nothing is drawn in its place."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtWidgets import QComboBox, QWidget

# The gradient-norm plot's choice of each parameter's gradient norm (RunHistory.parameter_norms)
# instead of a per-layer statistic: a curve per parameter of the ticked layers.
PER_PARAMETER = "param_grad_norm"
# history statistic -> how a plot names it
STATISTIC_LABELS = {
    "grad_norm": "‖grad‖",
    "max_abs": "max |g|",
    "weight_norm": "‖w‖",
    "update_ratio": "‖Δw‖/‖w‖",
    PER_PARAMETER: "‖grad‖ per parameter",
}
STATISTIC_TITLES = {
    "grad_norm": "Gradient norm",
    "max_abs": "Max |gradient|",
    "weight_norm": "Weight norm",
    "update_ratio": "Update ratio",
    PER_PARAMETER: "Gradient norm per parameter",
}
# Measured on detail steps only (GradientWatch(detail_every=...)): points, never lines
# through the steps in between.
DETAIL_ONLY = frozenset({"max_abs", "weight_norm", "update_ratio"})


class StatisticSelector(QComboBox):
    """A small combo box laid over a corner of a plot (it takes no height from the plot):
    the top-left one, or with ``bottom_right`` the corner of the value axis's label (a
    narrow chart's title has no room beside it); ``statistic_chosen`` carries the
    history's statistic name. ``per_parameter`` offers each parameter's norm too."""

    statistic_chosen = Signal(str)

    def __init__(
        self, plot_widget: QWidget, bottom_right: bool = False, per_parameter: bool = False
    ) -> None:
        super().__init__(plot_widget)
        self._bottom_right = bottom_right
        for name, label in STATISTIC_LABELS.items():
            if name != PER_PARAMETER or per_parameter:
                self.addItem(label, name)
        self.setToolTip(
            "The statistic this plot shows (max |g|, ‖w‖ and the update ratio are "
            "measured on detail steps only: drawn as points)"
            + (
                "; ‖grad‖ per parameter: a curve for each parameter of the ticked layers "
                "(layer.weight, layer.bias...)"
                if per_parameter
                else ""
            )
        )
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        font = self.font()
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        self.setFont(font)
        self.adjustSize()
        self._place()
        plot_widget.installEventFilter(self)
        self.currentIndexChanged.connect(self._on_current_index_changed)

    def _place(self) -> None:
        parent = self.parentWidget()
        if self._bottom_right and parent is not None:
            self.move(parent.width() - self.width() - 2, parent.height() - self.height() - 2)
        else:
            self.move(2, 2)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize:
            self._place()
        return False

    @property
    def statistic(self) -> str:
        return str(self.currentData())

    def choose(self, statistic: str) -> None:
        index = self.findData(statistic)
        if index < 0:
            raise ValueError(f"no such statistic: {statistic!r}")
        self.setCurrentIndex(index)

    def _on_current_index_changed(self, _index: int) -> None:
        self.statistic_chosen.emit(self.statistic)
