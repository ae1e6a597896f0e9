"""The step runner: forward, loss, backward, watch, optimizer step, one call at a time.

``StepRunner.step()`` does exactly one training step and returns a :class:`StepResult` of
plain data; ``run()`` is a generator of them. Callers (the CLI, the app's worker thread)
check their own stop/pause flags between steps. Settings may change between steps (learning
rate, clipping, loss scale, thresholds...), which is how the app's what-if works.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import nn

from gradscope.core.errors import (
    BatchMismatchError,
    GradScopeError,
    ModelScriptError,
    out_of_memory,
)
from gradscope.core.facts import Origin, StatisticInfo
from gradscope.core.loading import LoadedModel, user_traceback
from gradscope.core.module_tree import ModuleTree, build_module_tree
from gradscope.core.rng import RandomState, capture_random_state, restore_random_state
from gradscope.core.settings import RunSettings
from gradscope.core.trace import TraceEvent, trace_step
from gradscope.core.watch import GradientWatch, StepStats
from gradscope.core.watch.statistic_loader import load_statistics


@dataclass
class StepResult:
    """One step, as plain data. ``stats`` is None when the run is not watched."""

    step: int
    loss: float
    stats: StepStats | None
    origin: Origin | None
    applied: bool
    seconds: float
    trace: list[TraceEvent] | None = None

    @property
    def nonfinite(self) -> bool:
        if self.stats is not None:
            return self.stats.nonfinite
        return not math.isfinite(self.loss)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise GradScopeError(
                f"device {name!r} asked for, but CUDA is not available here "
                f"(torch {torch.__version__}, {'a CUDA' if torch.version.cuda else 'a CPU-only'} "
                "build, no usable GPU); use --device cpu"
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise GradScopeError(f"device {name!r} asked for; only {count} CUDA device(s) exist")
    return torch.device(name)


def describe_structure(value: Any) -> str:
    """Shapes of a batch, e.g. ``(5, 12)`` or ``dict(x=(5, 12), mask=(5,))``."""
    if isinstance(value, torch.Tensor):
        return str(tuple(value.shape))
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{k}={describe_structure(v)}" for k, v in value.items()) + ")"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(describe_structure(v) for v in value) + ")"
    return type(value).__name__


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(x)``, ``model(*inputs)`` or ``model(**inputs)`` by the batch's type."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def default_loss(output: Any, target: Any) -> torch.Tensor:
    """Cross-entropy for integer targets, otherwise MSE. Tuple outputs (torchvision's
    auxiliary-logit named tuples) use their first element, dict outputs their ``"out"``."""
    if isinstance(output, dict):
        output = output.get("out", next(iter(output.values())))
    if isinstance(output, (tuple, list)):
        output = output[0]
    if not isinstance(output, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise GradScopeError(
            "the default loss needs a tensor output and a tensor target; define "
            "loss_fn(output, target) in the model script"
        )
    if not target.is_floating_point() and not target.is_complex():
        return nn.functional.cross_entropy(output, target)
    if output.shape != target.shape:
        raise BatchMismatchError(
            f"the model's output has shape {tuple(output.shape)} but the target has shape "
            f"{tuple(target.shape)}; make them match in make_batch() or define loss_fn()"
        )
    return nn.functional.mse_loss(output, target)


def _default_loss_error(error: Exception, output: Any, target: Any) -> GradScopeError:
    """What the default loss could not do with this output and target, in their shapes."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    if isinstance(output, dict):
        output = output.get("out", next(iter(output.values()), None))
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    if not (isinstance(output, torch.Tensor) and isinstance(target, torch.Tensor)):
        return BatchMismatchError(f"the default loss failed: {first}")
    shapes = f"output {tuple(output.shape)}, target {tuple(target.shape)}"
    if not target.is_floating_point() and not target.is_complex():
        if target.dim() >= 1 and output.dim() >= 1 and target.shape[0] != output.shape[0]:
            return BatchMismatchError(
                f"the target has {target.shape[0]} labels for a batch of {output.shape[0]} "
                f"({shapes}); make_batch() must give one label per example"
            )
        classes = output.shape[1] if output.dim() >= 2 else output.shape[0]
        if target.numel():
            low, high = int(target.min()), int(target.max())
            if low < 0 or high >= classes:
                return BatchMismatchError(
                    f"the target holds class labels {low}..{high} but the model's output has "
                    f"{classes} classes, so labels must be 0..{classes - 1} ({shapes})"
                )
    return BatchMismatchError(
        f"the default loss (cross-entropy for integer targets, else MSE) failed on {shapes}: "
        f"{first}; make them fit in make_batch() or define loss_fn()"
    )


def _failing_module(model: nn.Module, error: BaseException) -> str | None:
    """The innermost module of ``model`` on the traceback: where a forward error happened."""
    names = {id(m): n for n, m in model.named_modules()}
    found = None
    tb: TracebackType | None = error.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if candidate is not None and id(candidate) in names:
            found = names[id(candidate)]
        tb = tb.tb_next
    return found


_SHAPE_WORDS = ("shape", "size", "mat1", "mat2", "dimension", "expected input", "must match")


def _build_optimizer(model: nn.Module, settings: RunSettings) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise GradScopeError("the model has no trainable parameters")
    if settings.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay
        )
    if settings.optimizer == "adam":
        return torch.optim.Adam(params, lr=settings.lr, weight_decay=settings.weight_decay)
    return torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)


@dataclass
class _Snapshot:
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    optimizer_kind: str  # settings.optimizer when it was taken: whose state ``optimizer`` is
    rng: RandomState
    first_nonfinite: Origin | None
    watch_step: int
    scaler: dict[str, Any] | None = None
    # The early warnings' series and the warnings given so far (None when off): a rewound
    # run warns again where the replayed steps do, from the series as they were.
    early_warnings: Any = None


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


class StepRunner:
    """Build the model from ``loaded`` and train it one step at a time.

    ``watch=False`` runs the same steps with no statistics (the plain baseline).
    ``layers`` overrides ``settings.layers`` (names or globs; None watches every layer
    with parameters).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        settings: RunSettings,
        *,
        watch: bool = True,
    ) -> None:
        self.loaded = loaded
        self.settings = settings.validated()
        self.device = resolve_device(settings.device)
        torch.manual_seed(settings.seed)
        model = loaded.build_model()
        if not isinstance(model, nn.Module):
            raise ModelScriptError(
                f"build_model() returned {type(model).__name__}, not a torch.nn.Module"
            )
        try:
            self.model = self.wrap_model(model.to(self.device).train())
        except torch.cuda.OutOfMemoryError:
            raise GradScopeError(f"the model does not fit in {self.device} memory") from None
        self.tree: ModuleTree = build_module_tree(self.model)
        self.optimizer = _build_optimizer(self.model, self.settings)
        # fp16 needs a loss scaler (its gradients underflow without one); bf16 does not.
        if self.settings.amp and any(
            p.dtype in (torch.float16, torch.bfloat16) for p in self.model.parameters()
        ):
            raise GradScopeError(
                f"--amp {self.settings.amp} runs a float32 model under autocast, but this "
                "model's parameters are already half precision (build_model converts it); "
                "drop --amp, or build the model in float32"
            )
        self.scaler = (
            torch.amp.GradScaler(self.device.type, init_scale=self.settings.amp_init_scale)
            if self.settings.amp == "fp16"
            else None
        )
        self._watching = watch
        self.watch: GradientWatch | None = self._make_watch(settings.layers) if watch else None
        self.step_index = 0
        self.first_nonfinite: Origin | None = None
        self.halted = False
        self._user_files = [loaded.path] if loaded.path else []
        self._snapshots: list[_Snapshot] = []
        self._computed: StepResult | None = None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The model the steps train, before the optimizer and the watch are made: ``model``
        itself here; a distributed runner wraps it in DDP or shards it."""
        return model

    @property
    def statistic_infos(self) -> list[StatisticInfo]:
        """What the watch says of its statistics (labels, schedules): the app's history
        takes them so that a live run's named statistics show under their labels."""
        return list(self.watch.statistic_infos) if self.watch is not None else []

    # -- configuration between steps -------------------------------------------------
    def _make_watch(self, layers: list[str] | None) -> GradientWatch:
        return GradientWatch(
            self.model,
            layers,
            explode_threshold=self.settings.explode_threshold,
            vanish_threshold=self.settings.vanish_threshold,
            vanish_steps=self.settings.vanish_steps,
            update_ratio=self.settings.update_ratio,
            scaler=self.scaler,
            detail_every=self.settings.detail_every,
            statistics=load_statistics(self.settings.statistics),
            early_warnings=self.settings.early_warnings,
        )

    def set_layers(self, layers: list[str] | None) -> None:
        """Watch a different set of layers from the next step on."""
        if not self._watching:
            return
        if self.watch is not None:
            self.watch.close()
        step = self.watch.step if self.watch is not None else 0
        self.watch = self._make_watch(layers)
        self.watch.step = step
        self.settings.layers = layers

    def apply_settings(self, settings: RunSettings) -> None:
        """Take new settings from the next step on. The device and seed are fixed for a run;
        a different optimizer starts with fresh optimizer state."""
        settings = settings.validated()
        if settings.device != self.settings.device:
            raise GradScopeError("the device cannot change during a run; start a new run")
        if settings.amp != self.settings.amp:
            raise GradScopeError("mixed precision cannot change during a run; start a new run")
        old = self.settings
        self.settings = settings
        if settings.optimizer != old.optimizer:
            self.optimizer = _build_optimizer(self.model, settings)
        else:
            self._set_hyperparameters()
        if self.watch is not None:
            self.watch.explode_threshold = settings.explode_threshold
            self.watch.vanish_threshold = settings.vanish_threshold
            self.watch.set_vanish_steps(settings.vanish_steps)
            self.watch.update_ratio_enabled = settings.update_ratio
            self.watch.detail_every = settings.detail_every
            # The early warnings add forward statistics and their hooks: turning them on or
            # off makes the watch anew, as a change of the watched layers does.
            if settings.layers != old.layers or settings.early_warnings != old.early_warnings:
                self.set_layers(settings.layers)
        self.halted = False

    def _set_hyperparameters(self) -> None:
        """The optimizer's learning rate, weight decay and momentum from the settings."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.settings.lr
            group["weight_decay"] = self.settings.weight_decay
            if "momentum" in group:
                group["momentum"] = self.settings.momentum

    # -- stepping --------------------------------------------------------------------
    def _batch(self) -> tuple[Any, Any]:
        try:
            batch = self.loaded.make_batch(self.settings.batch_size, self.device)
        except GradScopeError:
            raise
        except Exception as error:
            memory = out_of_memory(error)
            if memory is None:
                raise
            size = self.loaded.image_size
            images = f" of {size}x{size} images" if size is not None else ""
            raise GradScopeError(
                f"a batch of {self.settings.batch_size}{images} does not fit in {self.device} "
                f"memory ({memory}); lower --batch-size"
                + (" or --image-size" if size is not None else "")
            ) from None
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise ModelScriptError(
                "make_batch(batch_size, device) must return (inputs, target), "
                f"not {type(batch).__name__}"
            )
        return batch[0], batch[1]

    def _autocast(self) -> Any:
        """Autocast for the forward and the loss under ``--amp`` (a no-op otherwise)."""
        amp = self.settings.amp
        dtype = torch.float16 if amp == "fp16" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype, enabled=bool(amp))

    def _loss(self, inputs: Any, target: Any) -> torch.Tensor:
        try:
            with self._autocast():
                output = call_model(self.model, inputs)
        except GradScopeError:
            raise
        except (Exception, SystemExit) as error:
            memory = out_of_memory(error)
            if memory is not None:
                raise GradScopeError(
                    f"the forward pass ran out of {self.device} memory ({memory}) at batch "
                    f"size {self.settings.batch_size}; lower --batch-size"
                    + (" or --image-size" if self.loaded.image_size is not None else "")
                ) from None
            raise self._forward_error(error, inputs) from error
        with self._autocast():
            if self.loaded.loss_fn is not None:
                loss = self.loaded.loss_fn(output, target)
            else:
                try:
                    loss = default_loss(output, target)
                except GradScopeError:
                    raise
                except Exception as error:
                    raise _default_loss_error(error, output, target) from None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ModelScriptError(
                f"the loss must be a single-element tensor, got {describe_structure(loss)}"
            )
        loss = loss.reshape(())
        if self.settings.loss_scale != 1.0:
            loss = loss * self.settings.loss_scale
        return loss

    def _forward_error(self, error: BaseException, inputs: Any) -> GradScopeError:
        module = _failing_module(self.model, error)
        where = f" in module {module or '(model root)'!r}" if module is not None else ""
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        lines = user_traceback(error, self._user_files)
        if isinstance(error, (RuntimeError, ValueError)) and any(
            word in first_line.lower() for word in _SHAPE_WORDS
        ):
            return BatchMismatchError(
                f"the batch does not fit the model: inputs {describe_structure(inputs)} "
                f"failed{where}: {first_line}",
                lines,
            )
        if isinstance(error, SystemExit):
            return ModelScriptError(
                f"the model's forward called sys.exit({error.code!r}){where}", lines
            )
        return ModelScriptError(
            f"the model's forward raised {type(error).__name__}{where}: {first_line}", lines
        )

    def step(self) -> StepResult:
        """One forward/backward/optimizer step. When a NaN/Inf appears, the step's origin is
        located and (unless ``keep_going``) the optimizer step is not applied, so the weights
        and gradients stay as they were for inspection."""
        return self.apply(self.compute())

    def compute(self) -> StepResult:
        """The first half of a step: forward, loss, backward, statistics (and the trace in
        trace mode), without the optimizer. The gradients are complete and inspectable until
        :meth:`apply` (the app's "pause before the optimizer step")."""
        started = time.perf_counter()
        step = self.step_index
        self._take_snapshot()
        self.optimizer.zero_grad(set_to_none=True)
        inputs, target = self._batch()
        rng_before = capture_random_state()
        trace = None
        if self.settings.trace:
            with trace_step(self.model, step) as trace:
                loss = self._forward_backward(inputs, target)
        else:
            loss = self._forward_backward(inputs, target)
        stats = None
        if self.watch is not None:
            self.watch.optimizers = [self.optimizer]
            stats = self.watch.collect(
                loss, locate=self._relocate(inputs, target, rng_before), batch=(inputs, target)
            )
        loss_value = stats.loss if stats is not None else float(loss.detach())
        result = StepResult(
            step=step,
            loss=float(loss_value),
            stats=stats,
            origin=stats.origin if stats is not None else None,
            applied=False,
            seconds=0.0,
            trace=trace.events if trace is not None else None,
        )
        if result.origin is not None and self.first_nonfinite is None:
            self.first_nonfinite = result.origin
        result.seconds = time.perf_counter() - started
        self._computed = result
        return result

    def _forward_backward(self, inputs: Any, target: Any) -> torch.Tensor:
        loss = self._loss(inputs, target)
        try:
            if loss.requires_grad:
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        except GradScopeError:
            raise
        except (Exception, SystemExit) as error:
            memory = out_of_memory(error)
            if memory is not None:
                raise GradScopeError(
                    f"backward ran out of {self.device} memory ({memory}) at batch size "
                    f"{self.settings.batch_size}; lower --batch-size"
                ) from None
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ModelScriptError(
                f"backward failed: {type(error).__name__}: {first}",
                user_traceback(error, self._user_files),
            ) from error
        return loss

    def apply(self, result: StepResult) -> StepResult:
        """The second half of a step: clip and apply the optimizer with the current settings
        (so a clip or learning rate set while paused before it takes effect here), unless
        the step went non-finite and ``keep_going`` is off."""
        if self._computed is not result:
            raise RuntimeError("apply() takes the result of the latest compute()")
        self._computed = None
        started = time.perf_counter()
        if not result.nonfinite or self.settings.keep_going:
            scaler = self.scaler
            if self.settings.clip is not None:
                if scaler is not None:
                    scaler.unscale_(self.optimizer)  # clip the true gradients
                torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.grad is not None], self.settings.clip
                )
            if scaler is not None:
                scaler.step(self.optimizer)  # skips the update when the gradients overflowed
                scaler.update()
            else:
                self.optimizer.step()
            result.applied = True
            if self.watch is not None and self.settings.update_ratio:
                self.watch.measure_update()
        else:
            self.halted = True
        self.step_index += 1
        result.seconds += time.perf_counter() - started
        return result

    @property
    def pending_step(self) -> StepResult | None:
        """A step computed but not yet applied (paused before the optimizer step)."""
        return self._computed

    # -- rewind ------------------------------------------------------------------------
    def _take_snapshot(self) -> None:
        depth = self.settings.rewind_depth
        if depth <= 0:
            self._snapshots.clear()
            return
        self._snapshots.append(
            _Snapshot(
                step=self.step_index,
                model={k: v.detach().clone() for k, v in self.model.state_dict().items()},
                optimizer=copy.deepcopy(self.optimizer.state_dict()),
                optimizer_kind=self.settings.optimizer,
                rng=capture_random_state(),
                first_nonfinite=self.first_nonfinite,
                watch_step=self.watch.step if self.watch is not None else 0,
                scaler=self.scaler.state_dict() if self.scaler is not None else None,
                early_warnings=self._early_warnings_copy(),
            )
        )
        del self._snapshots[:-depth]

    def _early_warnings_copy(self) -> Any:
        monitor = self.watch.early_warnings if self.watch is not None else None
        return copy.deepcopy(monitor) if monitor is not None else None

    @property
    def rewind_steps(self) -> list[int]:
        """Steps the run can go back to (the state just before each of them is kept)."""
        return [snapshot.step for snapshot in self._snapshots]

    def snapshot_bytes(self) -> int:
        """Memory held by the rewind snapshots (model and optimizer tensors)."""
        total = 0
        for snapshot in self._snapshots:
            tensors = list(snapshot.model.values()) + _tensors_in(snapshot.optimizer)
            total += sum(t.numel() * t.element_size() for t in tensors)
        return total

    def rewind(self, step: int) -> None:
        """Go back to just before ``step``: weights, optimizer state and random state as they
        were, so the same settings reproduce the same losses bit for bit; change settings
        first for a what-if. The current settings then apply (learning rate, momentum, weight
        decay; an optimizer other than the snapshot's starts fresh). Later snapshots are
        dropped (their branch is gone)."""
        index = next((i for i, s in enumerate(self._snapshots) if s.step == step), None)
        if index is None:
            raise GradScopeError(
                f"cannot rewind to step {step}; kept: {self.rewind_steps or 'none'}"
            )
        snapshot = self._snapshots[index]
        del self._snapshots[index:]
        self.model.load_state_dict(snapshot.model)
        if snapshot.optimizer_kind == self.settings.optimizer:
            self.optimizer.load_state_dict(snapshot.optimizer)
        else:
            # The kept state belongs to the optimizer used then (SGD's momentum buffers have
            # no Adam "step"): the current one starts fresh, as apply_settings() does.
            self.optimizer = _build_optimizer(self.model, self.settings)
        if self.scaler is not None and snapshot.scaler is not None:
            self.scaler.load_state_dict(snapshot.scaler)
        # The state dict brought back that step's learning rate etc.; the current settings
        # are what the run goes on with (and what the app shows).
        self._set_hyperparameters()
        restore_random_state(snapshot.rng)
        self.first_nonfinite = snapshot.first_nonfinite
        self.step_index = snapshot.step
        if self.watch is not None:
            self.watch.step = snapshot.watch_step
            if self.watch.early_warnings is not None and snapshot.early_warnings is not None:
                self.watch.early_warnings = snapshot.early_warnings  # its snapshot is dropped
        self.optimizer.zero_grad(set_to_none=True)
        self._computed = None
        self.halted = False

    def _relocate(self, inputs: Any, target: Any, rng_before: Any) -> Any:
        """The watch's ``locate`` for this step: the same batch, from the random state the
        step started with (dropout draws the same masks)."""

        def locate() -> torch.Tensor:
            restore_random_state(rng_before)
            return self._loss(inputs, target)

        return locate

    def run(self, steps: int | None = None) -> Iterator[StepResult]:
        """Up to ``steps`` (default: the settings') steps; stops early when halted."""
        for _ in range(self.settings.steps if steps is None else steps):
            result = self.step()
            yield result
            if self.halted:
                return

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
