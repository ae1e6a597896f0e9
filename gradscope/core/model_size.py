"""How many parameters a model by name has, told before it is built (Open model by name
asks before building a huge one: vit_h_14 takes 16 s and 5 GB here, a billion-parameter timm
model longer).

torchvision's weights carry the count in their metadata (``meta["num_params"]``: nothing is
downloaded); otherwise the model is built on PyTorch's ``meta`` device, which makes its
modules and parameter shapes without any storage or initialisation (0.07 s for vit_h_14,
0.7 s for timm's 1-billion-parameter vit_giant_patch14_224 here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Above this a model asks before it is built.
HUGE_MODEL_PARAMETERS = 300_000_000


def _counted_on_meta(build: Callable[[], Any]) -> int | None:
    import torch

    try:
        with torch.device("meta"):
            model = build()
        return int(sum(p.numel() for p in model.parameters()))
    except Exception:  # a model that cannot be made without storage: unknown, not huge
        return None


def estimated_parameters(source: str) -> int | None:
    """The parameter count of the model ``source`` names (a torchvision name or
    ``timm:<name>``) without building it for real; None when it cannot be told (a script,
    an ``hf:`` model: those are scaled down for a CPU when big, see core/zoo.py)."""
    if source.startswith("timm:"):
        from gradscope.core.zoo import require

        timm = require("timm", "timm")
        name = source.split(":", 1)[1]
        return _counted_on_meta(lambda: timm.create_model(name, pretrained=False))
    if ":" in source or source.endswith(".py"):
        return None
    import torchvision

    try:
        weights = torchvision.models.get_model_weights(source).DEFAULT
        count = weights.meta.get("num_params")
        if isinstance(count, int):
            return count
    except (ValueError, KeyError, AttributeError):
        pass
    return _counted_on_meta(lambda: torchvision.models.get_model(source, weights=None))


def is_huge(count: int | None) -> bool:
    return count is not None and count > HUGE_MODEL_PARAMETERS
