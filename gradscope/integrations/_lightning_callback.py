"""The Lightning callback's behaviour, shared by the ``lightning`` and ``pytorch_lightning``
flavours (each Trainer accepts only callbacks derived from its own package's ``Callback``).
Imports neither package: the flavour modules pair this with their ``Callback``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from gradscope.integrations._callback import CallbackViews, CallbackWatch, LossAccumulator
from gradscope.integrations._repeat import KeptSteps


class LightningGradScope(CallbackViews):
    """Per-layer gradient statistics of every optimizer step of a Lightning Trainer,
    recorded for ``gradscope report`` and the app (``gradscope open``).

    ``record``: the recording's path; by default ``gradscope.gsrec`` in the Trainer's log
    folder (``lightning_logs/version_N``, or ``default_root_dir`` without a logger).
    ``layers``: module names or glob patterns of the LightningModule (default: every module
    with parameters). ``detail_every``: passed to the watch. ``open_app=True`` opens the app
    on the recording as training starts. ``log_to_trainer=True`` also logs the per-layer
    statistics (``gradscope/grad_norm/<layer>``...) to the Trainer's own loggers at its
    global step; ``tensorboard="DIR"`` writes them to a TensorBoard folder of their own.
    Other keyword arguments go to ``gradscope.watch`` (``explode_threshold``,
    ``vanish_threshold``, ``update_ratio``, ``statistics=[...]`` of your own,
    ``early_warnings=True``: warnings before a NaN/Inf, kept in the recording...).

    Statistics are taken in ``on_before_optimizer_step``: after backward (and, with
    gradient accumulation, after the last micro-batch's backward: once per optimizer step),
    after AMP's loss scaler has unscaled the gradients, before Lightning's gradient clipping
    and the optimizer step. Under DDP the gradients are already averaged over the
    processes; the global rank 0 records. The step's loss is the mean of its micro-batches'
    losses (from those passed to backward, which Lightning divides by the accumulation).
    """

    def __init__(
        self,
        record: str | os.PathLike[str] | None = None,
        layers: str | Sequence[str] | None = None,
        detail_every: int | None = None,
        *,
        open_app: bool = False,
        log_to_trainer: bool = False,
        **watch_options: Any,
    ) -> None:
        super().__init__()
        self._log_to_trainer = log_to_trainer
        self._gradscope = CallbackWatch(record, layers, detail_every, open_app, watch_options)
        self._losses = LossAccumulator()
        self._kept: KeptSteps | None = None  # the step's batches, for a NaN/Inf's repeat

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._losses.take()
        folder = None
        if self._gradscope.record is None:
            # Trainer.log_dir broadcasts rank 0's folder: a collective that every process
            # must join (rank 0 alone would wait for the others forever).
            folder = trainer.log_dir or trainer.default_root_dir
        if not trainer.is_global_zero:
            return
        settings = {
            "source": f"Lightning {type(pl_module).__name__}",
            "trainer": type(trainer).__module__.split(".")[0],
            "precision": str(trainer.precision),
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "gradient_clip_val": trainer.gradient_clip_val,
            "strategy": type(trainer.strategy).__name__,
            "world_size": trainer.world_size,
            "max_steps": trainer.max_steps,
        }
        sinks = []
        if self._log_to_trainer:
            if trainer.loggers:
                from gradscope.integrations._trainer_logger_sink import TrainerLoggerSink

                sinks.append(TrainerLoggerSink(trainer))
            else:
                from gradscope.core.user_warnings import warn_user

                warn_user("GradScopeCallback(log_to_trainer=True): the Trainer has no logger")
        self._gradscope.start(pl_module, folder or trainer.default_root_dir, settings, sinks)
        self._kept = KeptSteps(getattr(trainer.precision_plugin, "train_step_context", None))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int):
        # training_step often calls submodules, never the module's own forward: keep the
        # batch and repeat training_step itself if this step goes non-finite
        if self._kept is not None and self._gradscope.watch is not None:
            if pl_module.automatic_optimization:
                self._kept.keep(lambda: _repeat_training_step(pl_module, batch, batch_idx))

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._gradscope.watch is not None:
            self._losses.add(loss)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._gradscope.watch is None:
            return
        loss, count = self._losses.take()
        accumulate = trainer.accumulate_grad_batches
        if (
            loss is not None
            and count != accumulate
            and trainer.lightning_module.automatic_optimization
        ):
            # The last step of an epoch can have fewer micro-batches; each was still divided
            # by accumulate_grad_batches: the mean of their losses, as every other step's.
            loss = loss * (accumulate / count)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if loss is not None and scaler is not None:
            # 16-bit AMP hands on_before_backward the scaled loss; the gradients are
            # unscaled by now. The scale as a tensor: dividing costs no synchronisation.
            scale = getattr(scaler, "_scale", None)
            loss = loss / (scale.to(loss.device) if scale is not None else scaler.get_scale())
        locate = self._kept.take() if self._kept is not None else None
        self._gradscope.collect(loss, trainer.global_step, locate)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._gradscope.close()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._gradscope.close()


def _repeat_training_step(pl_module: Any, batch: Any, batch_idx: int) -> Any:
    """``training_step`` again on the kept batch, with its ``self.log`` calls muted (the
    repeat is no step of the run's)."""
    pl_module.__dict__["log"] = pl_module.__dict__["log_dict"] = _muted
    try:
        return pl_module.training_step(batch, batch_idx)
    finally:
        pl_module.__dict__.pop("log", None)
        pl_module.__dict__.pop("log_dict", None)


def _muted(*args: Any, **kwargs: Any) -> None:
    return None
