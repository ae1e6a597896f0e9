"""Why a layer's gradient is tiny: a zero or tiny scale parameter after it in its block,
read from real timm models' own initialisation (no weights downloaded)."""

from __future__ import annotations

import timm
import torch
from torch import nn

from gradscope.core.tiny_gradient import tiny_scale_after


def test_timm_resnet18_zero_last_bn_explains_the_exactly_zero_gradient_before_it():
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False)
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    assert float(model.layer1[0].conv1.weight.grad.abs().max()) == 0.0  # what it explains
    found = tiny_scale_after(model, "layer1.0.conv1")
    assert found is not None and found.parameter == "layer1.0.bn2.weight"
    assert found.largest == 0.0
    text = found.describe()
    assert "layer1.0.bn2.weight after it in its block is exactly 0" in text
    assert "exactly 0 until it moves away from 0" in text
    # the last BN itself, and the layers after the block's zero scale, have none
    assert tiny_scale_after(model, "layer1.0.bn2") is None
    assert tiny_scale_after(model, "fc") is None


def test_timm_convnext_layer_scale_of_1e_6_explains_a_tiny_gradient_in_its_block():
    model = timm.create_model("convnext_atto", pretrained=False)
    for layer in ("stages.0.blocks.0.conv_dw", "stages.0.blocks.0.mlp.fc1"):
        found = tiny_scale_after(model, layer)
        assert found is not None and found.parameter == "stages.0.blocks.0.gamma", layer
        assert abs(found.largest - 1e-6) < 1e-9
        assert "is at most 1e-06" in found.describe() and "scaled by 1e-06" in found.describe()


def test_no_tiny_scale_once_the_scale_has_trained_or_in_a_plain_mlp():
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 3, 64, 64)).logsumexp(-1).sum().backward()
    optimizer.step()  # the zero BN weight got a gradient of its own and moved
    assert float(model.layer1[0].bn2.weight.detach().abs().max()) > 1e-4
    assert tiny_scale_after(model, "layer1.0.conv1") is None
    mlp = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    assert tiny_scale_after(mlp, "0") is None
    assert tiny_scale_after(mlp, "no.such.layer") is None


class _ScaledBlock(nn.Module):
    """A block whose output is multiplied by a tiny layer scale (as ConvNeXt's gamma)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gamma = nn.Parameter(torch.full((4,), 1e-9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x) * self.gamma


def test_the_watch_says_why_a_layer_turned_vanishing_in_events_report_and_tree():
    """The engine finds the reason at the onset (a rare status change); the history's event,
    the JSON report and the app's tree tooltip show it; nothing recomputes it."""
    import gradscope
    from gradscope.core.history import RunHistory
    from gradscope.core.report import build_report
    from gradscope.core.watch import STATUS_VANISHING

    torch.manual_seed(0)
    model = nn.Sequential(_ScaledBlock(), nn.Linear(4, 1))
    watch = gradscope.watch(model, layers=["0.fc", "1"])
    history = RunHistory()
    names = [layer.name for layer in watch.layers]
    for step in range(4):
        model.zero_grad()
        loss = model(torch.randn(8, 4)).square().mean()
        loss.backward()
        stats = watch.collect(loss)
        history.append(step, float(loss.detach()), stats, names)
        if step == 2:  # the third measured step under the threshold: the onset
            assert stats.status[0] == STATUS_VANISHING
            assert "0.gamma after it in its block is at most 1e-09" in stats.tiny_reasons["0.fc"]
        else:
            assert stats.tiny_reasons is None
    onset = [e for e in history.events if e.kind == "vanishing" and e.layer == "0.fc"]
    assert onset and "why: 0.gamma after it" in onset[0].message
    report = build_report("test", "cpu", history)
    layers = {entry["name"]: entry for entry in report["layers"]}
    assert "0.gamma" in layers["0.fc"]["why_tiny"] and layers["1"]["why_tiny"] is None


def test_one_computation_of_onsets_the_history_batched_and_the_recording_agree(tmp_path):
    """History.append, History.extend (the app's batches) and the recording writer note the
    same onsets, the vanishing one with its reason (StatusOnsets, one computation)."""
    import gradscope
    from gradscope.core.history import RunHistory
    from gradscope.core.recording import RecordingReader, RecordingWriter

    torch.manual_seed(0)
    model = nn.Sequential(_ScaledBlock(), nn.Linear(4, 1))
    watch = gradscope.watch(model, layers=["0.fc", "1"])
    names = [layer.name for layer in watch.layers]
    collected = []
    for _ in range(5):
        model.zero_grad()
        loss = model(torch.randn(8, 4)).square().mean()
        loss.backward()
        collected.append(watch.collect(loss))
    appended, batched = RunHistory(), RunHistory()
    path = tmp_path / "run.gsrec"
    with RecordingWriter(path) as writer:
        for stats in collected:
            appended.append(stats.step, stats.loss, stats, names)
            writer.append(stats, watch.layers)
    batched.extend([(s.step, s.loss, s, None) for s in collected], names)
    with RecordingReader(path) as reader:
        _, recorded = reader.load()
    onsets = [e for e in appended.events if e.kind == "vanishing"]
    assert onsets and "why: 0.gamma after it" in onsets[0].message
    assert batched.events == appended.events
    assert recorded.events == appended.events
    assert batched.tiny_reasons == appended.tiny_reasons
