"""``GradScopeCallback`` for transformers' ``Trainer``.

```python
from gradscope.integrations.transformers import GradScopeCallback

trainer = Trainer(model, args, train_dataset=data, callbacks=[GradScopeCallback()])
```
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
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

from gradscope.integrations._callback import CallbackWatch, LossAccumulator

__all__ = ["GradScopeCallback"]


class GradScopeCallback(TrainerCallback):
    """Per-layer gradient statistics of every optimizer step of a transformers Trainer,
    recorded for ``gradscope report`` and the app (``gradscope open``).

    ``record``: the recording's path; by default ``gradscope.gsrec`` in ``output_dir``
    (``gradscope-2.gsrec``... when an earlier run's is there). ``layers``: module names or
    glob patterns of the model (default: every module with parameters). ``detail_every``:
    passed to the watch. ``open_app=True`` opens the app on the recording as training
    starts. Other keyword arguments go to ``gradscope.watch``.

    Statistics are taken in ``on_pre_optimizer_step``: once per optimizer step, after the
    last micro-batch's backward under gradient accumulation, with the gradients already
    averaged over DDP processes and unscaled from fp16 AMP, just before
    ``optimizer.step()``. The Trainer clips gradients (``max_grad_norm``, 1.0 by default)
    before any callback is called, so the norms recorded are the clipped ones (a NaN or
    Inf survives clipping and is flagged); ``max_grad_norm=0`` records the raw norms.
    The loss of a step is its micro-batches' ``output.loss`` combined as the Trainer does
    (summed when the model was given ``num_items_in_batch``, else averaged). The main process
    (``state.is_world_process_zero``) records.
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

    @property
    def path(self) -> Path | None:
        """Where the recording is written (None before training starts, or on a process
        that does not record)."""
        return self._gradscope.path

    @property
    def watch(self) -> Any:
        """The live watch while training runs (None otherwise)."""
        return self._gradscope.watch

    @property
    def last_stats(self) -> Any:
        """The last optimizer step's :class:`~gradscope.core.watch.StepStats`."""
        return self._gradscope.last_stats

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

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any):
        if self._gradscope.watch is not None:
            loss, count = self._losses.take()
            if loss is not None and count > 1 and not self._summed:
                loss = loss / count
            self._summed = False
            self._gradscope.collect(loss, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self._stop()

    def _stop(self) -> None:
        if self._loss_hook is not None:
            self._loss_hook.remove()
            self._loss_hook = None
        self._losses.take()
        self._gradscope.close()
