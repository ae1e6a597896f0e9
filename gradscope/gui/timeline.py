"""The trace timeline: one tick per event of a traced step, a slider, Previous/Next, and
"first NaN/Inf". Moving it tells the window which module to highlight; the side panel shows
the gradient coming into and going out of that module."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from gradscope.core.trace import BACKWARD, FORWARD, TraceEvent, first_nonfinite_event
from gradscope.core.watch import STATUS_NONFINITE
from gradscope.gui.status_style import STATUS_COLORS, format_value

_FORWARD_COLOR = QColor("#4c78a8")
_BACKWARD_COLOR = QColor("#9467bd")
_NONFINITE_COLOR = QColor(STATUS_COLORS[STATUS_NONFINITE])


@dataclass(frozen=True)
class TraceCursor:
    """Where the timeline stands: the event index and the event itself."""

    index: int
    event: TraceEvent
    # The user moved it (a key, a click, a button); False when a new traced step placed it.
    walked: bool = True


class _TickStrip(QWidget):
    """Ticks for every event: blue forward, purple backward, red where a value turned
    non-finite; the current event is outlined."""

    clicked = Signal(int)

    def __init__(self) -> None:
        super().__init__()
        self.events: list[TraceEvent] = []
        self.current = -1
        self.setMinimumHeight(18)
        self.setToolTip("Each tick is one event: blue forward, purple backward, red NaN/Inf")

    def sizeHint(self) -> QSize:
        return QSize(400, 18)

    def _x(self, index: int) -> float:
        count = max(len(self.events), 1)
        return 6 + (self.width() - 12) * (index + 0.5) / count

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        height = self.height()
        for index, item in enumerate(self.events):
            if item.nonfinite:
                color = _NONFINITE_COLOR
            else:
                color = _FORWARD_COLOR if item.phase == FORWARD else _BACKWARD_COLOR
            painter.setPen(QPen(color, 2 if item.nonfinite else 1))
            x = self._x(index)
            top = 2 if item.nonfinite else 5
            painter.drawLine(int(x), top, int(x), height - top)
        if 0 <= self.current < len(self.events):
            x = self._x(self.current)
            painter.setPen(QPen(QColor("#222"), 1.5))
            painter.drawRect(QRectF(x - 3, 1, 6, height - 2))
        painter.end()

    def mousePressEvent(self, event) -> None:
        if not self.events:
            return
        count = len(self.events)
        fraction = (event.position().x() - 6) / max(self.width() - 12, 1)
        self.clicked.emit(min(count - 1, max(0, int(fraction * count))))


class TraceTimeline(QWidget):
    """Walk through a traced step: Previous/Next, the slider (Home/End), first NaN/Inf."""

    event_selected = Signal(object)  # TraceCursor

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.events: list[TraceEvent] = []
        self._placing = False
        self.ticks = _TickStrip()
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setEnabled(False)
        self.previous_button = QPushButton("◀ Previous")
        self.next_button = QPushButton("Next ▶")
        self.first_nonfinite_button = QPushButton("First NaN/Inf")
        self.first_nonfinite_button.setToolTip("Jump to the first event with a NaN/Inf (F)")
        self.position_label = QLabel("Trace mode is off: turn it on in Run settings, then Step")
        self.detail_label = QLabel("")
        self.detail_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.detail_label.setWordWrap(True)

        buttons = QHBoxLayout()
        buttons.addWidget(self.previous_button)
        buttons.addWidget(self.next_button)
        buttons.addWidget(self.first_nonfinite_button)
        buttons.addWidget(self.position_label, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        layout.addWidget(self.ticks)
        layout.addWidget(self.slider)
        layout.addLayout(buttons)
        layout.addWidget(self.detail_label)

        self.slider.valueChanged.connect(self._on_slider_value_changed)
        self.ticks.clicked.connect(self.slider.setValue)
        self.previous_button.clicked.connect(self.previous)
        self.next_button.clicked.connect(self.next)
        self.first_nonfinite_button.clicked.connect(self.jump_to_first_nonfinite)
        # Left/Right/F are the window's actions (see StepDebugger), so that they work wherever
        # the focus is; Home/End are the slider's own keys.
        self._update_buttons()

    # -- public ------------------------------------------------------------------------
    def set_events(self, events: list[TraceEvent]) -> None:
        """Show a new traced step; the cursor starts at the first NaN/Inf event, or at the
        first backward event when there is none."""
        self.events = list(events)
        self.ticks.events = self.events
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(len(self.events) - 1, 0))
        self.slider.setEnabled(bool(self.events))
        self.slider.blockSignals(False)
        # Start where it went wrong, else where the backward pass begins.
        start = first_nonfinite_event(self.events)
        if start is None:
            start = next((i for i, e in enumerate(self.events) if e.phase == BACKWARD), 0)
        if self.events:
            self._placing = True
            try:
                if self.slider.value() == start:
                    self._on_slider_value_changed(start)
                else:
                    self.slider.setValue(start)
            finally:
                self._placing = False
        else:
            self.position_label.setText("No trace for this step")
            self.detail_label.setText("")
            self.ticks.current = -1
            self.ticks.update()
        self._update_buttons()

    @property
    def index(self) -> int:
        return self.slider.value() if self.events else -1

    def previous(self) -> None:
        self.slider.setValue(max(0, self.slider.value() - 1))

    def next(self) -> None:
        self.slider.setValue(min(self.slider.maximum(), self.slider.value() + 1))

    def jump_to_first_nonfinite(self) -> None:
        index = first_nonfinite_event(self.events)
        if index is not None:
            self.slider.setValue(index)

    # -- internals ---------------------------------------------------------------------
    def _update_buttons(self) -> None:
        has = bool(self.events)
        self.previous_button.setEnabled(has)
        self.next_button.setEnabled(has)
        self.first_nonfinite_button.setEnabled(first_nonfinite_event(self.events) is not None)

    def _on_slider_value_changed(self, index: int) -> None:
        if not (0 <= index < len(self.events)):
            return
        event = self.events[index]
        self.ticks.current = index
        self.ticks.update()
        module = event.module or "(model)"
        self.position_label.setText(
            f"step {event.step} · event {index + 1}/{len(self.events)} · {event.phase} · {module}"
        )
        self.detail_label.setText(describe_event(event))
        self.event_selected.emit(TraceCursor(index, event, walked=not self._placing))


def describe_event(event: TraceEvent) -> str:
    """The side panel's text: what came into and went out of the module at this event."""
    if event.phase == FORWARD:
        parts = [f"output norm {format_value(event.out_norm)}"]
        if event.max_abs is not None:
            parts.append(f"max |x| {format_value(event.max_abs)}")
    else:
        parts = [f"gradient arriving at the output {format_value(event.out_norm)}"]
        parts.append(
            "gradient leaving to the inputs "
            + (format_value(event.in_norm) if event.in_norm is not None else "(none needed)")
        )
        for name, value in event.param_norms.items():
            parts.append(f"{name}.grad {format_value(value)}")
    if event.nonfinite:
        parts.append("NaN/Inf here")
    return " · ".join(parts)
