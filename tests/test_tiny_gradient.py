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
