"""The trace timeline and the diagnosis pane, driven with real traced steps and real origins."""

from __future__ import annotations

import torch
from PySide6.QtCore import Qt
from torch import nn

from gradscope.core.origin import locate_first_nonfinite
from gradscope.core.trace import BACKWARD, gradients_until, trace_step
from gradscope.gui.diagnosis_pane import DiagnosisPane
from gradscope.gui.timeline import TraceTimeline


def _traced_events(poison: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    if poison:
        with torch.no_grad():
            model[2].weight[0, 0] = float("inf")
    with trace_step(model) as trace:
        model(torch.randn(5, 3)).sum().backward()
    return model, trace.events


def test_timeline_walks_the_backward_pass(qtbot):
    _, events = _traced_events()
    timeline = TraceTimeline()
    qtbot.addWidget(timeline)
    seen = []
    timeline.event_selected.connect(lambda cursor: seen.append(cursor.event.module))
    timeline.set_events(events)
    # starts at the first backward event: the model's output
    assert timeline.events[timeline.index].phase == BACKWARD
    for _ in range(3):
        timeline.next()
    assert seen == ["", "2", "1", "0"]
    qtbot.keyClick(timeline.slider, Qt.Key.Key_Home)
    assert timeline.index == 0
    assert not timeline.first_nonfinite_button.isEnabled()
    assert "output norm" in timeline.detail_label.text()


def test_gradient_flow_fills_in_from_output_to_input():
    model, events = _traced_events()
    first_backward = next(i for i, e in enumerate(events) if e.phase == BACKWARD)
    assert gradients_until(events, first_backward - 1) == {}
    after_head = gradients_until(events, first_backward + 1)
    assert set(after_head) == {"2"}
    everything = gradients_until(events, len(events) - 1)
    expected = torch.linalg.vector_norm(
        torch.cat([model[0].weight.grad.flatten(), model[0].bias.grad])
    ).item()
    assert abs(everything["0"] - expected) < 1e-5


def test_timeline_jumps_to_first_nonfinite(qtbot):
    _, events = _traced_events(poison=True)
    timeline = TraceTimeline()
    qtbot.addWidget(timeline)
    timeline.set_events(events)
    assert timeline.first_nonfinite_button.isEnabled()
    # a step that went wrong opens at its first NaN/Inf event
    assert events[timeline.index].nonfinite
    first = timeline.index
    timeline.slider.setValue(0)
    with qtbot.waitSignal(timeline.event_selected) as blocker:
        qtbot.mouseClick(timeline.first_nonfinite_button, Qt.MouseButton.LeftButton)
    cursor = blocker.args[0]
    assert cursor.index == first
    assert cursor.event.nonfinite and cursor.event.module == "2"
    assert all(not e.nonfinite for e in events[: cursor.index])


def test_diagnosis_pane_opens_the_file_at_the_line(qtbot, tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Log(nn.Module):\n"
        "    def forward(self, x):\n        return torch.log(x - x.max())\n"
    )
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    model = nn.Sequential(nn.Linear(3, 3), namespace["Log"]())
    origin = locate_first_nonfinite(model, lambda: model(torch.randn(2, 3)).sum())
    pane = DiagnosisPane()
    qtbot.addWidget(pane)
    pane.show_origin(origin)
    assert pane.highlighted_line == 7
    assert "torch.log(x - x.max())" in pane.source.textCursor().block().text()
    assert "hint:" in pane.summary.text() and "module '1'" in pane.summary.text()
    pane.show_origin(None)
    assert pane.source.toPlainText() == ""


def test_diagnosis_shows_paths_relative_to_the_working_folder(tmp_path, monkeypatch):
    from gradscope.gui.diagnosis_pane import display_path

    inside = tmp_path / "models" / "net.py"
    monkeypatch.chdir(tmp_path)
    assert display_path(str(inside)) == "models/net.py"
    monkeypatch.setenv("HOME", str(tmp_path / "models"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert display_path(str(inside)) == "~/net.py"
