"""Open model by name asks before building a huge model: the parameter count is told without
building it (torchvision's weight metadata, or a build on the meta device)."""

from __future__ import annotations

import pytest
import torchvision

from gradscope.core.model_size import HUGE_MODEL_PARAMETERS, estimated_parameters, is_huge


def _built(name: str) -> int:
    return sum(p.numel() for p in torchvision.models.get_model(name, weights=None).parameters())


def test_torchvision_counts_come_from_the_weights_metadata() -> None:
    assert estimated_parameters("resnet18") == _built("resnet18") == 11_689_512
    count = estimated_parameters("vit_h_14")
    assert count is not None and count > 600_000_000 and is_huge(count)
    assert not is_huge(estimated_parameters("vit_b_16"))
    assert is_huge(estimated_parameters("vit_l_16"))  # 304M: just over the bound


def test_a_model_without_metadata_is_counted_on_the_meta_device(monkeypatch) -> None:
    def no_weights(name):
        raise ValueError(name)

    monkeypatch.setattr(torchvision.models, "get_model_weights", no_weights)
    assert estimated_parameters("resnet18") == 11_689_512
    assert estimated_parameters("squeezenet1_0") == _built("squeezenet1_0")


def test_timm_models_are_counted_without_building_them() -> None:
    pytest.importorskip("timm")
    import timm

    assert estimated_parameters("timm:resnet18") == sum(
        p.numel() for p in timm.create_model("resnet18", pretrained=False).parameters()
    )
    assert estimated_parameters("timm:vit_giant_patch14_224") > 1_000_000_000


def test_scripts_and_hf_models_are_not_estimated() -> None:
    assert estimated_parameters("my_model.py") is None
    assert estimated_parameters("hf:gpt2") is None
    assert not is_huge(None) and HUGE_MODEL_PARAMETERS == 300_000_000
