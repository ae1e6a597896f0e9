"""The early warnings' output RMS (gradscope/core/watch/statistics/output_rms.py): its
figures against plain torch, float16 outputs whose squares overflow float16 included."""

import math

import pytest
import torch
from torch import nn

import gradscope
from gradscope.core.watch.statistics.output_rms import OutputRMS


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_rms_of_an_output_as_torch_computes_it_in_float64(dtype):
    torch.manual_seed(0)
    output = (torch.randn(7, 33) * 300).to(dtype)  # float16 squares of 300 overflow
    value = OutputRMS().output(nn.Identity(), output)
    assert value.dtype == torch.float32 and value.dim() == 0
    expected = output.double().pow(2).mean().sqrt().item()
    assert math.isfinite(value.item())
    assert value.item() == pytest.approx(expected, rel=1e-5)
    assert OutputRMS().output(nn.Identity(), torch.zeros(0, 3, dtype=dtype)) is None


def test_the_watch_records_each_layers_output_rms_on_due_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    outputs = {}
    for name, module in model.named_children():
        module.register_forward_hook(
            lambda m, i, o, name=name: outputs.__setitem__(name, o.detach().clone())
        )
    with gradscope.watch(model, early_warnings=True) as watch:
        loss = model(torch.randn(4, 5)).square().mean()
        loss.backward()
        stats = watch.collect(loss)
    names = [layer.name for layer in watch.layers]
    expected = [outputs[name].double().pow(2).mean().sqrt().item() for name in names]
    assert stats.figures["out_rms"].tolist() == pytest.approx(expected, rel=1e-6)
    assert "out_rms" in {info.name for info in watch.statistic_infos}


def test_the_rms_is_read_on_detail_steps_only_without_the_dense_start():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    measured = []
    with gradscope.watch(model, early_warnings=True, detail_every=4) as watch:
        for _ in range(9):
            loss = model(torch.randn(4, 5)).square().mean()
            model.zero_grad()
            loss.backward()
            figures = watch.collect(loss).figures
            assert "out_max_abs" in figures  # the warnings' dense start
            measured.append("out_rms" in figures)
    assert measured == [step % 4 == 0 for step in range(9)]
