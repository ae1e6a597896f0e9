"""Where a run's model comes from: a model script, a torchvision name, or hf:/timm: by name,
and the run settings that go with it. One dispatch over the loaders (gradscope.core.loading
for scripts and torchvision, gradscope.core.zoo for hf:/timm:), which need nothing of each
other."""

from __future__ import annotations

import os
from typing import Any

from gradscope.core.errors import GradScopeError
from gradscope.core.loading import LoadedModel, load_script, load_torchvision
from gradscope.core.settings import RunSettings, settings_from_config


def load_source(
    source: str,
    image_size: int = 224,
    weights: str | None = None,
    options: dict[str, Any] | None = None,
) -> LoadedModel:
    """A ``.py`` path, a torchvision model name, or hf:/timm: (``options``: the user's run
    settings, for the model's own input size, ``seq_len`` and ``model_config``)."""
    if source.startswith(("hf:", "timm:")):
        from gradscope.core.zoo import load_zoo_model  # imports transformers/timm

        return load_zoo_model(source, weights=weights, options=options)
    if (options or {}).get("model_config"):
        raise GradScopeError("--config applies to hf: and timm: models only")
    if source.endswith(".py") or os.sep in source or "/" in source:
        if weights:
            raise GradScopeError("--weights applies to torchvision models only")
        return load_script(source)
    return load_torchvision(source, image_size=image_size, weights=weights)


def load_with_settings(
    source: str,
    overrides: dict[str, Any] | None = None,
    weights: str | None = None,
    defaults: dict[str, Any] | None = None,
) -> tuple[LoadedModel, Any]:
    """Load ``source`` and settle its run settings: RunSettings' defaults, then ``defaults``
    (the caller's, e.g. the app's), then the script's ``CONFIG``, then ``overrides`` (what the
    user set on the command line or in the app)."""
    # None is a value here ("clip": None turns a script's clipping off); the CLI passes only
    # what the user typed.
    overrides = dict(overrides or {})
    image_size = overrides.get("image_size") or RunSettings.image_size
    loaded = load_source(source, image_size=image_size, weights=weights, options=overrides)
    settings = settings_from_config(defaults or {})
    settings = settings_from_config(loaded.config, settings)
    settings = settings_from_config(overrides, settings)
    if loaded.image_size is not None and loaded.image_size != settings.image_size:
        settings = settings.replaced(image_size=loaded.image_size)
    return loaded, settings
