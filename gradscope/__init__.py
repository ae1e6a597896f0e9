"""GradScope: see where a PyTorch training run's gradients explode, vanish or turn NaN/Inf.

``import gradscope`` stays cheap (no torch import) so the app can show its window fast;
``gradscope.watch`` imports the engine on first use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gradscope._version import __version__

if TYPE_CHECKING:
    from gradscope.core.watch import GradientWatch
    from gradscope.core.watch.statistics import Statistic

__all__ = ["Statistic", "__version__", "watch"]


def __getattr__(name: str) -> Any:
    # ``gradscope.Statistic`` imports the engine (torch) on first use only.
    if name == "Statistic":
        from gradscope.core.watch.statistics import Statistic

        return Statistic
    raise AttributeError(f"module 'gradscope' has no attribute {name!r}")


def watch(
    model: Any,
    layers: Any = None,
    *,
    record: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
    tensorboard: str | os.PathLike[str] | None = None,
    wandb: Any = None,
    **options: Any,
) -> GradientWatch:
    """Watch ``model``'s gradients: call ``.collect(loss)`` after each ``loss.backward()``.

    ``layers`` is None (every module that owns parameters) or names/glob patterns of
    ``model.named_modules()``. ``model`` may be wrapped (DDP, ``torch.compile``).

    ``stats = watch.collect(loss, locate=lambda: criterion(model(x), y))`` returns the
    step's statistics; on the first step of each NaN/Inf episode ``stats.origin`` says where
    it came from (module, operation, line), found by re-running the step through
    ``locate``. The re-run never raises into your loop, never runs a collective, and is
    bounded in time. See :class:`gradscope.core.watch.GradientWatch` for every option.

    ``record="runs/exp1.gsrec"`` also writes every collected step to that recording file
    (with ``settings``, an optional JSON-able dict, stored alongside; an existing file gets
    a new numbered name, unless ``overwrite=True``). Call ``.close()`` at the end (or use
    ``with``) so the last steps are flushed.

    ``tensorboard="runs/tb"`` writes every step's statistics as TensorBoard scalars
    (``gradscope/grad_norm/<layer>``...; ``pip install "gradscope[tensorboard]"``);
    ``wandb=True`` logs them into the active ``wandb.run`` (or pass a run;
    ``pip install "gradscope[wandb]"``). See :mod:`gradscope.core.export`.

    ``statistics=[GradRMS(), ...]``: figures of your own, subclasses of
    :class:`gradscope.Statistic`, in ``stats.figures[name]`` on the steps they are due.

    ``early_warnings=True``: ``stats.warnings`` names what spikes, drifts towards its dtype's
    limits or sits close to them, before any NaN/Inf (see :mod:`gradscope.core.warnings`).
    Their forward statistics (each layer's output max |x| and RMS, the head's log-partition) are
    measured at every step of the first 100, then every ``detail_every`` steps (10): dense
    where warm-up failures come, sparse for a long run's cost.
    """
    from gradscope.core.watch import GradientWatch

    sinks = list(options.pop("sinks", ()))
    if tensorboard is not None or (wandb is not None and wandb is not False):
        from gradscope.core.export.sinks import export_sinks

        exports = export_sinks(tensorboard=tensorboard, wandb=wandb)
        sinks.extend(exports)
    else:
        exports = []
    try:
        return GradientWatch(
            model, layers, record=record, settings=settings, sinks=sinks, **options
        )
    except BaseException:
        for sink in exports:
            sink.close()
        raise
