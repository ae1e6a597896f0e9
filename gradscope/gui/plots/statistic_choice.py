"""Which of the engine's per-layer statistics a plot shows, and the selector that picks it.

The history holds every statistic the watch measures per layer (gradient norm on every step;
max |g|, weight norm and update ratio on detail steps only; any named statistic, a user's
``gradscope.Statistic``, on the steps it was due); the plots draw whichever is chosen.
Statistics measured on some steps only are drawn as the points they are: a step without
them is MISSING, and nothing is drawn in its place. A named statistic is offered under its
label as soon as the history holds it (:meth:`StatisticSelector.offer`)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtWidgets import QComboBox, QWidget

from gradscope.core.history import RunHistory

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
        # Named statistics offered: name -> (label, drawn as points), in the history's order.
        self._named: dict[str, tuple[str, bool]] = {}
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

    def offer(self, history: RunHistory) -> None:
        """Offer the history's named statistics (and no other run's): each under its label,
        drawn as points when it is measured on some steps only (``every`` > 1, or, not
        described, a step it was not due at)."""
        named: dict[str, tuple[str, bool]] = {}
        for name in history.figure_names:
            info = history.statistic_infos.get(name)
            sparse = info.every > 1 if info is not None else not history.figure_due(name).all()
            label = info.shown_as if info is not None else name
            named[name] = (label, sparse)
        if named == self._named:
            return
        chosen = self.statistic
        self.blockSignals(True)
        try:
            for name in self._named:
                self.removeItem(self.findData(name))
            for name, (label, _sparse) in named.items():
                self.addItem(label, name)
            self._named = named
            index = self.findData(chosen)
            self.setCurrentIndex(max(index, 0))
        finally:
            self.blockSignals(False)
        self.adjustSize()
        self._place()
        if self.statistic != chosen:  # the chosen one was another run's
            self.statistic_chosen.emit(self.statistic)

    def label(self, statistic: str) -> str:
        """How the plot names ``statistic`` (its axis, tooltips)."""
        found = STATISTIC_LABELS.get(statistic)
        if found is not None:
            return found
        return self._named[statistic][0] if statistic in self._named else statistic

    def title(self, statistic: str) -> str:
        return STATISTIC_TITLES.get(statistic) or self.label(statistic)

    def points_only(self, statistic: str) -> bool:
        """Measured on some steps only: drawn as points, never lines through the gaps."""
        return statistic in DETAIL_ONLY or self._named.get(statistic, ("", False))[1]

    def choose(self, statistic: str) -> None:
        index = self.findData(statistic)
        if index < 0:
            raise ValueError(f"no such statistic: {statistic!r}")
        self.setCurrentIndex(index)

    def _on_current_index_changed(self, _index: int) -> None:
        self.statistic_chosen.emit(self.statistic)
