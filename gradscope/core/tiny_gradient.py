"""Why a layer's gradient is tiny, where the model shows it cheaply: a scale parameter after
it in its block that is zero or tiny (a BatchNorm weight zero-initialised as timm's ResNets
do for each block's last BN, ConvNeXt's and ViT's layer scale of 1e-6). Every gradient
that flows through such a scale is multiplied by it, so the layers before it inside the
block get a gradient that much smaller (exactly 0 behind a 0), while the block's shortcut
keeps the rest of the model training. Read from the weights alone: no step is re-run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

TINY_SCALE = 1e-4  # a scale this small or smaller shrinks what flows back through it
_SCALE_NAMES = ("gamma", "scale", "layer_scale", "ls")
# how many enclosing modules to look through: the layer's block, and the block around a
# sub-block (ConvNeXt's mlp inside its block)
_LEVELS = 2


@dataclass(frozen=True)
class TinyScale:
    """A zero or tiny scale parameter after a layer in its block."""

    layer: str
    parameter: str  # its full name, e.g. "layer1.0.bn2.weight"
    largest: float  # its largest |value|

    def describe(self) -> str:
        size = "exactly 0" if self.largest == 0 else f"at most {self.largest:.3g}"
        effect = (
            "exactly 0 until it moves away from 0 (a zero-initialised last BN or layer scale: "
            "by design, the block starts as its shortcut)"
            if self.largest == 0
            else f"scaled by {self.largest:.3g} (a small initial layer scale: by design)"
        )
        return (
            f"{self.parameter} after it in its block is {size}, so the gradient reaching "
            f"{self.layer or '(model)'} through it is {effect}."
        )


def _scale_parameters(module: nn.Module, prefix: str, direct_only: bool = False):
    """(full name, parameter) of the scale parameters in ``module``: a norm layer's weight,
    or a parameter named like a layer scale, with at most one dimension."""
    modules = [("", module)] if direct_only else module.named_modules()
    for path, owner in modules:
        is_norm = "Norm" in type(owner).__name__
        for local, parameter in owner.named_parameters(recurse=False):
            if parameter.dim() > 1:
                continue
            if (is_norm and local == "weight") or local.lower() in _SCALE_NAMES:
                yield ".".join(filter(None, (prefix, path, local))), parameter


def _largest(parameter: torch.Tensor) -> float | None:
    if not parameter.numel() or parameter.is_meta or not parameter.is_floating_point():
        return None
    with torch.no_grad():
        value = float(parameter.detach().abs().max())
    return value if value == value else None  # a NaN weight is another story


def tiny_scale_after(model: nn.Module, layer: str, tiny: float = TINY_SCALE) -> TinyScale | None:
    """The first zero or tiny scale parameter after ``layer`` in its block: the modules
    registered after it in its parent, the parent's own scale parameters, and those of the
    module around the parent (ConvNeXt's ``gamma`` for a layer of the block's ``mlp``); None
    when there is none or ``layer`` is not in ``model``."""
    parts = layer.split(".") if layer else []
    for level in range(1, min(_LEVELS, len(parts)) + 1):
        parent_path = ".".join(parts[:-level])
        child = parts[-level]
        try:
            parent = model.get_submodule(parent_path)
        except AttributeError:
            return None
        candidates = list(_scale_parameters(parent, parent_path, direct_only=True))
        names = [name for name, _ in parent.named_children()]
        if child not in names:
            return None
        # further out only the enclosing block's own scale: its later children (the next
        # residual block) have a shortcut around them
        later = names[names.index(child) + 1 :] if level == 1 else []
        for name in later:
            prefix = ".".join(filter(None, (parent_path, name)))
            candidates.extend(_scale_parameters(getattr(parent, name), prefix))
        for name, parameter in candidates:
            largest = _largest(parameter)
            if largest is not None and largest <= tiny:
                return TinyScale(layer, name, largest)
    return None
