"""Every torchvision classification model runs by name at the size GradScope gives it.

The whole registry is built and run forward and backward on the meta device (shapes only,
no arithmetic: about 0.3 s a model), with GradScope's own size rule and default loss; a few
cheap models then run one real step through ``gradscope run``."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator

import pytest
import torch
import torchvision
from torch import nn

from gradscope.cli import main
from gradscope.core.loading import torchvision_input_size, torchvision_model_names
from gradscope.core.runner import call_model, default_loss


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Build with parameters and buffers on the meta device while the constructor's own
    arithmetic stays on the CPU (regnet computes its widths with tensors and ``tolist()``,
    which a meta default device cannot do)."""
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def parameter(self, name, param):
        if param is not None:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register_parameter(self, name, param)

    def buffer(self, name, tensor, persistent=True):
        register_buffer(self, name, None if tensor is None else tensor.to("meta"), persistent)

    nn.Module.register_parameter, nn.Module.register_buffer = parameter, buffer
    try:
        yield
    finally:
        nn.Module.register_parameter, nn.Module.register_buffer = (
            register_parameter,
            register_buffer,
        )


def _build_on_meta(name: str) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # googlenet/inception init notice
        try:
            with torch.device("meta"):
                return torchvision.models.get_model(name, weights=None)
        except NotImplementedError:  # "Cannot copy out of meta tensor"
            with _parameters_on_meta():
                return torchvision.models.get_model(name, weights=None)


def test_the_registry_is_all_there():
    names = torchvision_model_names()
    assert len(names) >= 80 and {"inception_v3", "vit_h_14", "resnet18"} <= set(names)


@pytest.mark.parametrize("name", torchvision_model_names())
def test_every_model_runs_forward_and_backward_at_its_size(name):
    size, _ = torchvision_input_size(name, 224)  # the default --image-size
    model = _build_on_meta(name).train()
    images = torch.empty(2, 3, size, size, device="meta")
    labels = torch.empty(2, dtype=torch.long, device="meta")
    loss = default_loss(call_model(model, images), labels)
    assert loss.shape == ()
    loss.backward()
    # Every parameter gets a gradient, except auxiliary heads, whose logits the default
    # loss leaves out (googlenet, inception_v3).
    without = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert [n for n in without if not n.lower().startswith("aux")] == []


@pytest.mark.parametrize(
    ("name", "size"),
    [("squeezenet1_1", 64), ("mobilenet_v3_small", 64), ("shufflenet_v2_x0_5", 64)],
)
def test_one_real_step_of_a_cheap_model(name, size, tmp_path, capsys):
    report = tmp_path / "r.json"
    argv = ["run", name, "--steps", "1", "--batch-size", "2", "--device", "cpu"]
    code = main([*argv, "--image-size", str(size), "--json", str(report)])
    capsys.readouterr()
    assert code == 0
    data = json.loads(report.read_text())
    assert data["steps_run"] == 1 and data["error"] is None
    assert data["settings"]["image_size"] == size
    assert all(isinstance(value, float) for value in data["total_grad_norm"])
