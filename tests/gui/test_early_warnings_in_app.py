"""Early warnings (#37) in the app: the settings that turn them on and pause at the first one,
the tree's colour and the Events list for a warned layer, a live run's named statistics
under their labels, and the plot's limit and projection for the warning's quantity."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from gradscope.core.settings import RunSettings
from gradscope.gui.module_tree_model import NAME, STATUS
from gradscope.gui.settings_panel import SettingsPanel
from gradscope.gui.status_style import WARNING_TINT
from tests.gui.conftest import write_script
from tests.gui.gui_helpers import open_and_wait, run_and_wait

ROOT = Path(__file__).resolve().parents[2]

# The float16 residual stream of tests/models/drift_cases.py, as a model script: at Adam's
# lr 0.2 its blocks' outputs reach float16's headroom within a dozen steps, long before the
# loss breaks (step 102 in the drift case).
DRIFTING = """
import sys
sys.path.insert(0, {root!r})

import torch
from torch.nn import functional as F
from tests.models.drift_cases import CLASSES, FEATURES, ResidualClassifier

CONFIG = {{"steps": 40, "batch_size": 64, "optimizer": "adam", "lr": 0.2, "device": "cpu"}}
_PROTOTYPES = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(4))


def build_model():
    return ResidualClassifier(torch.float16)


def make_batch(batch_size, device):
    labels = torch.randint(0, CLASSES, (batch_size,), device=device)
    return _PROTOTYPES[labels] + 2 * torch.randn(batch_size, FEATURES, device=device), labels
"""

# The LM head of tests/models/drift_cases.py computed in float16 without z-loss: its
# log-partition drifts towards exp's float16 overflow (11.09); the warning projects when.
LM_HEAD = """
import sys
sys.path.insert(0, {root!r})

import torch
from tests.models.drift_cases import VOCAB, BigramLM, _half_softmax_loss

CONFIG = {{"steps": 70, "batch_size": 32, "optimizer": "adam", "lr": 1.5e-3, "device": "cpu"}}
_SUCCESSOR = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))
loss_fn = _half_softmax_loss(0.0)


def build_model():
    return BigramLM()


def make_batch(batch_size, device):
    tokens = torch.randint(0, VOCAB, (batch_size,), device=device)
    return tokens, _SUCCESSOR[tokens]
"""


@pytest.fixture
def drifting(tmp_path: Path) -> str:
    return write_script(tmp_path, "drifting_half_stream.py", DRIFTING.format(root=str(ROOT)))


def test_the_tree_shows_a_warning_under_worse_statuses_only(qtmodeltester) -> None:
    from torch import nn

    from gradscope.core.facts import STATUS_EXPLODING, STATUS_OK, EarlyWarning
    from gradscope.core.module_tree import build_module_tree
    from gradscope.gui.module_tree_model import ModuleTreeModel
    from gradscope.gui.status_style import STATUS_TINTS

    model = ModuleTreeModel()
    net = nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 1))
    model.set_tree(build_module_tree(net), ["0.0", "1"])
    drift = EarlyWarning(7, "0.0", "drifting", "output max |x|", 9.0, 65504.0, "grows", 30, "h")
    spike = EarlyWarning(9, "1", "spiking", "output max |x|", 5.0, None, "jumps", None, "h")
    loss = EarlyWarning(9, None, "spiking", "loss", 50.0, None, "loss jumps", None, "h")
    model.set_step_values(
        {"0.0": 1.0, "1": 2e4}, {"0.0": STATUS_OK, "1": STATUS_EXPLODING}, {}, [drift, spike, loss]
    )
    qtmodeltester.check(model, force_py=True)
    background = Qt.ItemDataRole.BackgroundRole
    assert model.data(model.index_of("0.0", STATUS)) == "drifting"
    assert model.data(model.index_of("0.0", NAME), background).color().name() == WARNING_TINT
    assert "Hint: h" in model.data(model.index_of("0.0", NAME), Qt.ItemDataRole.ToolTipRole)
    assert model.data(model.index_of("0", STATUS)) == "warning inside"
    # Exploding says more than its precursor did.
    assert model.data(model.index_of("1", STATUS)) == "exploding"
    assert (
        model.data(model.index_of("1", NAME), background).color().name()
        == (STATUS_TINTS[STATUS_EXPLODING])
    )
    assert model.warned_layers() == ["0.0", "1"]  # the loss has no row
    model.set_step_values({"0.0": 1.0}, {"0.0": STATUS_OK}, {}, [])
    assert model.data(model.index_of("0.0", STATUS)) == "ok"
    assert model.data(model.index_of("0", STATUS)) in ("", None)


def test_the_panel_maps_early_warnings_and_offers_the_pause_only_with_them(qtbot) -> None:
    panel = SettingsPanel(cuda=[])
    qtbot.addWidget(panel)
    assert not panel.settings().early_warnings
    assert not panel.pause_at_warning.isEnabled()
    with qtbot.waitSignal(panel.settings_edited) as edited:
        panel.early_warnings.setChecked(True)
    assert edited.args[0].early_warnings
    assert panel.pause_at_warning.isEnabled()
    with qtbot.waitSignal(panel.pause_at_warning_toggled) as toggled:
        panel.pause_at_warning.setChecked(True)
    assert toggled.args == [True]
    panel.set_settings(RunSettings(early_warnings=False))
    assert not panel.early_warnings.isChecked() and not panel.pause_at_warning.isEnabled()
    panel.set_settings(RunSettings(early_warnings=True))
    assert panel.early_warnings.isChecked() and panel.pause_at_warning.isEnabled()
    panel.set_read_only(True)
    assert not panel.early_warnings.isEnabled() and not panel.pause_at_warning.isEnabled()


def test_a_live_run_pauses_at_its_first_warning_and_shows_it(qtbot, window, drifting) -> None:
    open_and_wait(qtbot, window, drifting, early_warnings=True)
    window.settings_panel.pause_at_warning.setChecked(True)
    assert window.run_thread.worker.pause_at_warning
    paused = run_and_wait(qtbot, window, window.run)
    assert paused.reason == "warning"
    history = window.history
    assert history.warnings, "the run paused without a warning"
    first_step = history.warnings[0].step
    # Paused right after the step that brought it, not at the end of the 40 steps.
    assert int(history.steps[-1]) == first_step < 39
    assert "first early warning" in window.statusBar().currentMessage()
    window._refresh()

    # The tree: the warned layer's status reads the warning's kind, in the warning's tint.
    warning = next(w for w in history.warnings if w.module)
    model = window.tree_model
    status = model.index_of(warning.module, STATUS)
    assert (
        model.data(status) == [w for w in history.warnings if w.module == warning.module][-1].kind
    )
    assert model.data(status).lower() != "ok"
    background = model.data(model.index_of(warning.module, NAME), 8)  # BackgroundRole
    assert background is not None and background.color().name() == WARNING_TINT
    assert warning.evidence in model.data(model.index_of(warning.module, NAME), 3)  # tooltip
    # Its parent says a layer inside warns.
    parent = warning.module.rpartition(".")[0]
    if parent and model.data(model.index_of(parent, STATUS)) not in (None, ""):
        assert model.data(model.index_of(parent, STATUS)) in ("warning inside", "ok")

    # The Events list: the kind, the evidence and the hint.
    table = window.events_panel.table
    rows = [
        [table.item(r, c).text() for c in range(4)]
        for r in range(table.rowCount())
        if table.item(r, 1).text() in ("spiking", "drifting", "low headroom")
    ]
    assert rows, "no warning row in Events"
    assert any(
        row[0] == str(warning.step)
        and row[1] == warning.kind
        and row[2] == warning.module
        and warning.evidence in row[3]
        and warning.hint in row[3]
        for row in rows
    )

    # Run goes on past the first warning (a breakpoint once per run, as the NaN's).
    paused = run_and_wait(qtbot, window, window.run)
    assert paused.reason == "completed"
    assert window.history.count == 40


def test_a_rewind_to_before_the_first_warning_pauses_there_again(qtbot, window, drifting) -> None:
    open_and_wait(qtbot, window, drifting, early_warnings=True, rewind_depth=30)
    window.settings_panel.pause_at_warning.setChecked(True)
    assert run_and_wait(qtbot, window, window.run).reason == "warning"
    first = window.history.warnings[0].step
    with qtbot.waitSignal(window.debugger.rewound, timeout=30_000):
        assert window.debugger.rewind(first - 2)
    qtbot.waitUntil(lambda: window.state != "running", timeout=30_000)
    assert window.history.warnings == []
    # The replayed steps bring the same first warning: the run pauses at it again.
    assert run_and_wait(qtbot, window, window.run).reason == "warning"
    assert int(window.history.steps[-1]) == first
    assert window.history.warnings[0].step == first


def test_paused_before_the_optimizer_step_a_warning_leaves_the_apply_pause(
    qtbot, window, drifting
) -> None:
    open_and_wait(qtbot, window, drifting, early_warnings=True, steps=20)
    window.settings_panel.pause_at_warning.setChecked(True)
    window.debugger.pause_before_apply_action.setChecked(True)
    reasons = []
    for _ in range(20):  # each Run applies the step pending and computes the next
        reasons.append(run_and_wait(qtbot, window, window.run).reason)
        if window.history.warnings:
            break
    assert window.history.warnings, reasons
    # The warning's step is paused before its optimizer step, as asked: Apply works there.
    assert set(reasons) == {"before_apply"}
    assert window.run_thread.worker.runner.pending_step is not None


def test_a_live_run_names_its_statistics_by_their_labels(qtbot, window, drifting) -> None:
    open_and_wait(qtbot, window, drifting, early_warnings=True, steps=3)
    info = window.history.statistic_infos.get("out_max_abs")
    assert info is not None and info.label == "Output max |x|"
    run_and_wait(qtbot, window, window.run)
    window._refresh()
    selector = window.plots.gradient_norm.statistic_selector
    labels = [selector.itemText(i) for i in range(selector.count())]
    assert "Output max |x|" in labels and "out_max_abs" not in labels


def test_the_apps_recording_keeps_the_labels_of_a_live_runs_statistics(
    qtbot, window, drifting
) -> None:
    from gradscope.core.recording import RecordingReader

    window.recordings.record_action.setChecked(True)
    open_and_wait(qtbot, window, drifting, steps=3)
    run_and_wait(qtbot, window, window.run)
    # Turned on mid-run: the new watch's statistics are described to the recording too.
    window.settings_panel.early_warnings.setChecked(True)
    window.settings_panel.steps.setValue(5)
    run_and_wait(qtbot, window, window.run)
    path = window.recordings.writer.path
    window.recordings.close_writer()
    with RecordingReader(path) as reader:
        _, history = reader.load()
    assert "out_max_abs" in history.figure_names
    assert history.statistic_info("out_max_abs").label == "Output max |x|"


def test_early_warnings_turned_on_mid_run_take_effect(qtbot, window, drifting) -> None:
    open_and_wait(qtbot, window, drifting, steps=3)
    run_and_wait(qtbot, window, window.run)
    assert "out_max_abs" not in window.history.figure_names
    window.settings_panel.early_warnings.setChecked(True)
    window.settings_panel.steps.setValue(16)
    run_and_wait(qtbot, window, window.run)
    assert "out_max_abs" in window.history.figure_names
    assert window.history.statistic_info("out_max_abs").label == "Output max |x|"
    assert window.history.warnings, "no warning after early warnings were turned on"
    changes = [e.message for e in window.history.events if e.kind == "settings"]
    assert changes == ["from step 3: steps 3 -> 16, early warnings off -> on"], changes
    rows = window.history.row_of_step(2), window.history.row_of_step(3)
    due = window.history.figure_due("out_max_abs")
    assert not due[rows[0]] and due[rows[1]]


def test_the_plot_draws_the_warnings_limit_and_its_projection(qtbot, window, tmp_path) -> None:
    script = write_script(tmp_path, "lm_head.py", LM_HEAD.format(root=str(ROOT)))
    open_and_wait(qtbot, window, script, early_warnings=True, steps=60)
    run_and_wait(qtbot, window, window.run)
    warning = next(w for w in window.history.warnings if w.kind == "drifting")
    assert (warning.module, warning.quantity) == ("head", "log-partition")
    assert warning.limit is not None and warning.steps_left is not None
    plot = window.plots.gradient_norm
    guides = plot.warning_guides
    window._refresh()
    assert not guides.limit_line.isVisible()  # the gradient norm has no warning
    # A click on the warning in Events shows its quantity, at its step.
    table = window.events_panel.table
    row = next(r for r in range(table.rowCount()) if table.item(r, 1).text() == "drifting")
    table.cellClicked.emit(row, 3)
    window._refresh()
    assert plot.statistic == "out_log_partition"
    assert (window.selected_layer, window.selected_step) == ("head", warning.step)
    assert guides.shown is warning
    window.selected_step = None
    window._refresh()
    assert guides.limit_line.isVisible() and guides.projection.isVisible()
    assert guides.limit_line.value() == pytest.approx(np.log10(warning.limit))
    assert "11.09" in guides.limit_line.label.format
    x, y = guides.projection.getData()
    assert list(x) == [warning.step, warning.step + warning.steps_left]
    assert list(y) == pytest.approx(np.log10([warning.value, warning.limit]))
    # On a linear axis: the values themselves.
    plot.set_linear(True)
    window._refresh()
    assert guides.limit_line.value() == pytest.approx(warning.limit)
    # A step shown before the warning: no guides yet.
    window.selected_step = warning.step - 1
    window._refresh()
    assert not guides.limit_line.isVisible() and not guides.projection.isVisible()
    # The head unticked: its warning is not drawn over the other layers.
    window.selected_step = None
    window.tree_model.edit_watched(
        [n for n in window.tree_model.watched_layers() if n != "head"], only=True
    )
    qtbot.waitUntil(lambda: not window.run_thread.busy, timeout=10_000)
    window._refresh()
    assert not guides.limit_line.isVisible()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
