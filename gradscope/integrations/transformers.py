"""``GradScopeCallback`` for transformers' ``Trainer``.

```python
from gradscope.integrations.transformers import GradScopeCallback

trainer = Trainer(model, args, train_dataset=data, callbacks=[GradScopeCallback()])
```
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError as _missing:
    raise ModuleNotFoundError(
        "gradscope.integrations.transformers needs transformers and accelerate: "
        'pip install "gradscope[hf]"',
        name=_missing.name,
    ) from None

from gradscope.integrations._callback import CallbackViews, CallbackWatch, LossAccumulator
from gradscope.integrations._repeat import KeptSteps

__all__ = ["GradScopeCallback"]


class GradScopeCallback(CallbackViews, TrainerCallback):
    """Per-layer gradient statistics of every optimizer step of a transformers Trainer,
    recorded for ``gradscope report`` and the app (``gradscope open``).

    ``record``: the recording's path; by default ``gradscope.gsrec`` in ``output_dir``
    (``gradscope-2.gsrec``... when an earlier run's is there). ``layers``: module names or
    glob patterns of the model (default: every module with parameters). ``detail_every``:
    passed to the watch. ``open_app=True`` opens the app on the recording as training
    starts. Other keyword arguments go to ``gradscope.watch`` (``statistics=[...]`` of your
    own among them, and ``early_warnings=True``: warnings before a NaN/Inf, kept in the
    recording).

    Statistics are taken once per optimizer step, after the last micro-batch's backward
    under gradient accumulation, with the gradients averaged over DDP processes and
    unscaled from fp16 AMP, and before the Trainer clips them (``max_grad_norm``, 1.0 by
    default): the norms recorded are the ones the Trainer logs as ``grad_norm``, so
    explosions show. (The Trainer clips before calling any callback; GradScope reads the
    gradients when accelerate unscales them for clipping, and falls back to
    ``on_pre_optimizer_step``, after clipping, where clipping takes another path.)
    The loss of a step is its micro-batches' ``output.loss`` combined as the Trainer does
    (summed when the model was given ``num_items_in_batch``, else averaged). The main
    process (``state.is_world_process_zero``) records, with its own loss (the Trainer
    logs the mean over the processes; that would take a collective).
    """

    def __init__(
        self,
        record: str | os.PathLike[str] | None = None,
        layers: str | Sequence[str] | None = None,
        detail_every: int | None = None,
        *,
        open_app: bool = False,
        **watch_options: Any,
    ) -> None:
        if not hasattr(TrainerCallback, "on_pre_optimizer_step"):
            import transformers

            raise RuntimeError(
                "GradScopeCallback reads the gradients in the Trainer's on_pre_optimizer_step "
                f"event, which transformers {transformers.__version__} does not have; "
                "upgrade it: pip install -U transformers"
            )
        self._gradscope = CallbackWatch(record, layers, detail_every, open_app, watch_options)
        self._losses = LossAccumulator()
        self._loss_hook: Any = None
        self._summed = False
        self._state: Any = None
        self._collected: int | None = None
        self._unwrap: Any = None
        self._loss_scale = 1
        self._kept: KeptSteps | None = None  # the step's inputs, for a NaN/Inf's repeat
        self._unwrap_loss: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs):
        self._stop()
        if model is None or not state.is_world_process_zero:
            return
        settings = {
            "source": f"transformers {type(model).__name__}",
            "trainer": "transformers",
            "learning_rate": args.learning_rate,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "max_grad_norm": args.max_grad_norm,
            "fp16": bool(args.fp16),
            "bf16": bool(args.bf16),
            "world_size": args.world_size,
            "max_steps": state.max_steps,
        }
        self._gradscope.start(model, args.output_dir, settings)
        # The loss each micro-batch's forward returned: one hook, on the root module only.
        self._loss_hook = model.register_forward_hook(self._on_forward, with_kwargs=True)
        self._state = state
        # Averaging tokens across processes, the model divides by the token count of every
        # process and the Trainer multiplies back by their number: this process's loss.
        average = getattr(args, "average_tokens_across_devices", False)
        self._loss_scale = args.world_size if average and args.world_size > 1 else 1
        trainer = _calling_trainer()
        self._follow_unscaling(trainer)
        self._keep_compute_loss(trainer, model)

    def _on_forward(self, module: Any, args: Any, kwargs: dict, output: Any) -> None:
        if not module.training or not torch.is_grad_enabled():
            return  # evaluation and generation are not training steps
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
        self._losses.add(loss)
        # Given the token count of the whole accumulated step, a model divides its loss by
        # it: each micro-batch's loss is then a part of the step's, to be summed.
        if kwargs.get("num_items_in_batch") is not None:
            self._summed = True

    def _follow_unscaling(self, trainer: Any) -> None:
        """Read the gradients before the Trainer clips them.

        The Trainer clips (``max_grad_norm``, 1.0 by default) before it calls any callback,
        so ``on_pre_optimizer_step`` sees clipped gradients: a run whose gradients explode
        would never look it. Accelerate's ``clip_grad_norm_`` first calls
        ``unscale_gradients()`` (AMP's unscale, a no-op without it), then clips. Wrapping that
        method on this Trainer's accelerator collects right between the two: after the last
        micro-batch's backward and the unscale, before clipping. Where clipping takes
        another path (DeepSpeed, some FSDP set-ups) the wrapper is never called on the
        step, and ``on_pre_optimizer_step`` collects instead."""
        accelerator = getattr(trainer, "accelerator", None)
        original = getattr(accelerator, "unscale_gradients", None)
        if original is None:
            return

        def unscale_gradients(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if getattr(accelerator, "sync_gradients", True):
                self._collect()
            return result

        accelerator.unscale_gradients = unscale_gradients
        self._unwrap = lambda: vars(accelerator).pop("unscale_gradients", None)

    def _keep_compute_loss(self, trainer: Any, model: Any) -> None:
        """Keep each training micro-batch's inputs as the Trainer hands them to
        ``compute_loss``, so that a NaN/Inf step is repeated as the Trainer computed it (its
        loss may be computed outside the model: label smoothing, a subclass's own loss); the
        repeat calls the model inside any DDP wrapper (no collective)."""
        original = getattr(trainer, "compute_loss", None)
        if original is None:
            return
        self._kept = KeptSteps(getattr(trainer, "compute_loss_context_manager", None))
        kept = self._kept

        def compute_loss(called: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            training = getattr(called, "training", False) and torch.is_grad_enabled()
            if training and not kwargs.get("return_outputs") and not args:
                # compute_loss may pop the labels: each repeat gets its own shallow copy
                given = dict(inputs) if isinstance(inputs, Mapping) else inputs
                kept.keep(lambda: original(model, _copied(given), **kwargs))
            return original(called, inputs, *args, **kwargs)

        trainer.compute_loss = compute_loss
        self._unwrap_loss = lambda: vars(trainer).pop("compute_loss", None)

    def _collect(self) -> None:
        """This optimizer step's statistics, once."""
        state = self._state
        if self._gradscope.watch is None or state is None or self._collected == state.global_step:
            return
        self._collected = state.global_step
        loss, count = self._losses.take()
        if loss is not None and count > 1 and not self._summed:
            loss = loss / count
        if loss is not None and self._summed and self._loss_scale != 1:
            loss = loss * self._loss_scale
        self._summed = False
        locate = self._kept.take() if self._kept is not None else None
        self._gradscope.collect(loss, state.global_step, locate)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self._collect()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self._stop()

    def _stop(self) -> None:
        if self._loss_hook is not None:
            self._loss_hook.remove()
            self._loss_hook = None
        if self._unwrap is not None:
            self._unwrap()
            self._unwrap = None
        if self._unwrap_loss is not None:
            self._unwrap_loss()
            self._unwrap_loss = None
        self._kept = None
        self._losses.take()
        self._state = None
        self._collected = None
        self._gradscope.close()


def _calling_trainer() -> Any:
    """The Trainer whose callback handler called us: callbacks are not given it, and its
    accelerator is where the gradients are unscaled and clipped. None if not found."""
    from transformers import Trainer

    frame = sys._getframe(2)
    for _ in range(10):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _copied(inputs: Any) -> Any:
    return dict(inputs) if isinstance(inputs, Mapping) else inputs
