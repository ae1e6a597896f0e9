"""A recording keeps the failing step's trace with its origin: opening it in the app lets
the user walk that step in the Step trace pane (Left/Right, F for the first NaN/Inf), the
tree following the module, as for a step of a run the app drives."""

from __future__ import annotations

import torch
from torch import nn

import gradscope


class Gate(nn.Module):
    """Passes its input through until broken; then its own code makes -inf."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def forward(self, x):
        return torch.log(x * 0.0) if self.broken else x


def _record_a_nan(path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), Gate(), nn.Linear(4, 4))
    with gradscope.watch(model, record=path) as watch:
        for step in range(3):
            model[2].broken = step == 2
            loss = model(torch.randn(2, 4)).sum()
            loss.backward()
            stats = watch.collect(loss)
            model.zero_grad()
    return stats.origin


def test_a_recordings_failing_step_is_walked_in_the_step_trace(qtbot, window, tmp_path):
    path = tmp_path / "nan.gsrec"
    origin = _record_a_nan(path)
    assert origin.module == "2"
    assert window.recordings.open_recording(path)
    timeline = window.debugger.timeline
    assert timeline.events, "the recorded trace reaches the Step trace pane"
    assert window.debugger.trace_dock.isVisible()
    # it opens at the first NaN/Inf event: the origin's module, in forward
    event = timeline.events[timeline.index]
    assert (event.module, event.phase) == ("2", "forward")
    assert event.summary["inf"] > 0
    window.debugger.next_event_action.trigger()
    assert timeline.index == timeline.events.index(event) + 1
    window.debugger.previous_event_action.trigger()
    window.debugger.first_nonfinite_event_action.trigger()
    assert timeline.events[timeline.index] is event
    window.debugger.next_event_action.trigger()
    window.debugger.first_nonfinite_event_action.trigger()  # F: back to the first NaN/Inf
    assert window.selected_layer == "2"  # the tree follows the module
