"""Statistics that apply to some layers only (they return None elsewhere: not applicable),
and the small run the tests of absent figures share: the engine's, the sinks', the committed
recording's (tests/data/absent_figures.gsrec) and the app's.

The model: Linear(5,7) - LayerNorm(7) - Tanh - Linear(7,3), watched layers "0", "1", "3".
``WeightRMS`` applies to matrices only, so the LayerNorm (two vectors) is absent from it, and
each Linear's figure is its weight's alone (a "mean" that counted the bias as 0 would halve
it). ``LinearOut`` applies to Linear outputs only, every second step.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import gradscope

STEPS = 4
LAYERS = ["0", "1", "3"]


class WeightRMS(gradscope.Statistic):
    name = "weight_grad_rms"
    label = "RMS of a weight matrix's gradient"
    combine = "mean"
    every = 1

    def parameter(self, grad, weight):
        if grad.dim() != 2:
            return None  # a bias or a norm's scale: not a weight matrix
        return grad.float().pow(2).mean().sqrt()


class LinearOut(gradscope.Statistic):
    name = "linear_out_max"
    label = "Max |output| of a Linear"
    combine = "max"
    every = 2

    def output(self, module, output):
        if not isinstance(module, nn.Linear):
            return None
        return output.float().abs().amax()


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.Tanh(), nn.Linear(7, 3))


def train(path: Path | None = None, tensorboard: Path | None = None, steps: int = STEPS):
    """Run ``steps`` steps watched with both statistics (recorded to ``path``, live
    TensorBoard to ``tensorboard``); returns the StepStats and, per step, what plain torch
    gives: each layer's weight-gradient RMS (None for the LayerNorm) and each Linear's max
    |output| (None for the LayerNorm)."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    watch = gradscope.watch(
        model,
        statistics=[WeightRMS(), LinearOut()],
        record=path,
        tensorboard=tensorboard,
    )
    modules = dict(model.named_modules())
    outputs: dict[str, torch.Tensor] = {}
    hooks = [
        modules[name].register_forward_hook(
            lambda m, a, out, name=name: outputs.__setitem__(name, out.detach())
        )
        for name in LAYERS
    ]
    all_stats, expected_rms, expected_out = [], [], []
    try:
        for _ in range(steps):
            optimizer.zero_grad()
            loss = ((model(torch.randn(8, 5)) - torch.randn(8, 3)) ** 2).mean()
            loss.backward()
            all_stats.append(watch.collect(loss))
            expected_rms.append(
                [
                    float(modules[n].weight.grad.pow(2).mean().sqrt())
                    if modules[n].weight.dim() == 2
                    else None
                    for n in LAYERS
                ]
            )
            expected_out.append(
                [
                    float(outputs[n].abs().amax()) if isinstance(modules[n], nn.Linear) else None
                    for n in LAYERS
                ]
            )
            optimizer.step()
    finally:
        for hook in hooks:
            hook.remove()
        watch.close()
    return all_stats, expected_rms, expected_out
