"""``GradScopeCallback`` for Lightning 2's Trainer (``lightning.pytorch``).

```python
from gradscope.integrations.lightning import GradScopeCallback

trainer = lightning.Trainer(callbacks=[GradScopeCallback(record="runs/exp1.gsrec")])
```

Lightning accepts only callbacks derived from its own package's ``Callback``: this one is
a ``lightning.pytorch.Callback``, or a ``pytorch_lightning.Callback`` when only the older
``pytorch_lightning`` package is installed. With both installed, a
``pytorch_lightning.Trainer`` takes :mod:`gradscope.integrations.pytorch_lightning`'s.
"""

from __future__ import annotations

try:
    from lightning.pytorch import Callback
except ImportError as _missing:
    try:
        from pytorch_lightning import Callback
    except ImportError:
        raise ModuleNotFoundError(
            'gradscope.integrations.lightning needs Lightning: pip install "gradscope[lightning]"',
            name=_missing.name,
        ) from None

from gradscope.integrations._lightning_callback import LightningGradScope

__all__ = ["GradScopeCallback"]


class GradScopeCallback(LightningGradScope, Callback):
    __doc__ = LightningGradScope.__doc__
