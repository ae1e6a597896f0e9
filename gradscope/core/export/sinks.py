"""The export sinks ``gradscope.watch(tensorboard=..., wandb=...)`` asks for."""

from __future__ import annotations

import os
from typing import Any


def export_sinks(tensorboard: str | os.PathLike[str] | None = None, wandb: Any = None) -> list[Any]:
    """``tensorboard``: a log folder; ``wandb``: True (the active run) or a run object.
    Each needs its optional package, imported only here."""
    sinks: list[Any] = []
    try:
        if tensorboard is not None:
            from gradscope.core.export.tensorboard_sink import TensorBoardSink

            sinks.append(TensorBoardSink(tensorboard))
        if wandb is not None and wandb is not False:
            from gradscope.core.export.wandb_sink import WandbSink

            sinks.append(WandbSink(None if wandb is True else wandb))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks
