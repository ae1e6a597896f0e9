"""``GradScopeCallback`` for a ``pytorch_lightning.Trainer`` (the older package name of
Lightning 2, which rejects callbacks of the ``lightning`` package); see
:mod:`gradscope.integrations.lightning`."""

from __future__ import annotations

try:
    from pytorch_lightning import Callback
except ImportError as _missing:
    raise ModuleNotFoundError(
        "gradscope.integrations.pytorch_lightning needs pytorch_lightning: "
        'pip install "gradscope[lightning]"',
        name=_missing.name,
    ) from None

from gradscope.integrations._lightning_callback import LightningGradScope

__all__ = ["GradScopeCallback"]


class GradScopeCallback(LightningGradScope, Callback):
    __doc__ = LightningGradScope.__doc__
