"""``gradscope attach``'s hooks: one watch per model a script's optimizers step, fed at every
optimizer step.

A step is read where the script's gradients are still its own (:mod:`.step_calls`): at
the first clipping call that touches the model's parameters (the figures and statuses are
then those before clipping, as the callbacks read them, and the recording says the script
clipped), else at ``scaler.step(optimizer)`` under a ``GradScaler`` (before the scaler
decides: a step it skips is recorded as skipped, with its number), else at the start of
``optimizer.step()`` (torch's global optimizer-step pre-hook). The stepped parameters
(those with a gradient) are matched to the models holding them (:mod:`.model_finder`);
each model gets its own watch and recording, the first at the path asked for, the others
beside it named after their class (``x.gsrec``, ``x.Discriminator.gsrec``): a GAN's
generator and discriminator are two runs of their own, each with its own step numbering.
A model's step N is the (N+1)-th optimizer step (skipped or not) that stepped it. Step 0
was captured from the model's first training forward, so a NaN/Inf there is located as at
any other step.

Nothing here may break the script: an error of GradScope's own while watching is printed
once to stderr and that model is no longer watched; the script goes on.
"""

from __future__ import annotations

import os
import sys
import traceback
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradscope.core.attach.app_launch import open_app
from gradscope.core.attach.loss_capture import LossCapture
from gradscope.core.attach.model_finder import ModelFinder, calls_as_batch
from gradscope.core.attach.step_calls import StepCalls
from gradscope.core.errors import GradScopeError
from gradscope.core.wrappers import unwrap_model

SUFFIX = ".gsrec"


def say(message: str) -> None:
    """GradScope's own output: stderr only (the script's stdout stays its own)."""
    print(f"gradscope attach: {message}", file=sys.stderr, flush=True)


@dataclass
class AttachOptions:
    record: str | os.PathLike[str]
    layers: Sequence[str] | None = None
    detail_every: int | None = None
    tensorboard: str | os.PathLike[str] | None = None
    open_app: bool = False
    source: str = ""
    # gradscope.Statistic subclasses (--statistic): each watch makes its own instances.
    statistics: Sequence[type] = ()
    # --early-warnings: each watch looks for the precursors of a NaN/Inf (#37).
    early_warnings: bool = False


@dataclass
class WatchedModel:
    model: nn.Module
    watch: Any
    path: Path | None
    optimizers: set[int] = field(default_factory=set)
    failed: bool = False
    # this step was read before its optimizer step (at clipping): the backward count then
    read_early: int | None = None
    clipping: dict[str, str] = field(default_factory=dict)  # the script's clipping calls
    skipped: int = 0  # steps the GradScaler skipped


class AttachSession:
    """Installs the hooks (:meth:`start`), watches what the script trains, and closes every
    watch and hook (:meth:`close`)."""

    def __init__(self, options: AttachOptions) -> None:
        self.options = options
        self.finder = ModelFinder()
        self.losses = LossCapture()
        self.models: dict[int, WatchedModel] = {}
        # optimizer -> ids of its models, and its steps so far (weak: a script that makes
        # a new optimizer per phase must not find an old one's models under a reused id)
        self._resolved: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()
        self._step_counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.optimizer_steps = 0  # every optimizer's together
        self._hook: Any = None
        self._warned: set[str] = set()
        self._apps: list[Any] = []
        self.calls = StepCalls(self._on_scale, self._on_scaler_step, self._on_clip)
        self._scaler: Any = None  # the GradScaler the script scales its loss with
        self._search_ended_at: int | None = None  # optimizer steps when the search ended

    def start(self) -> None:
        self.finder.start()
        self.losses.install()
        self.calls.install()
        from torch.optim.optimizer import register_optimizer_step_pre_hook as register

        self._hook = register(self._before_step)

    # -- at each optimizer step ---------------------------------------------------------
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.calls.inside_scaler_step(optimizer):  # else read at scaler.step
            self._read_step(optimizer)

    def _on_scaler_step(self, scaler: Any, optimizer: torch.optim.Optimizer) -> None:
        self._read_step(optimizer, scaler if scaler.is_enabled() else None)

    def _on_scale(self, scaler: Any, loss: torch.Tensor, scaled: torch.Tensor) -> None:
        if scaler.is_enabled():
            self._scaler = scaler
            self.losses.note_scaled(loss, scaled)

    def _read_step(self, optimizer: torch.optim.Optimizer, scaler: Any = None) -> None:
        index = self._step_counts.get(optimizer, 0)
        self._step_counts[optimizer] = index + 1
        self.optimizer_steps += 1
        # This step's loss, whether or not its models are known yet (never the next one's).
        loss = self.losses.take()
        try:
            models = self._models_of(optimizer, index)
        except Exception as error:  # never into the script
            self._warn_once("find", f"cannot find the models: {self._internal(error)}")
            return
        for entry in models:
            if entry.read_early == self.losses.backwards:  # read at the script's clipping
                entry.read_early = None
                continue
            self._collect(entry, loss, scaler or self._scaler, optimizer)
        ended = self._search_ended_at
        if ended is not None and self.optimizer_steps > ended:
            self._search_ended_at = None
            try:
                self.finder.drop_captures()
            except Exception as error:  # never into the script
                self._warn_once("drop", f"letting go of a capture: {self._internal(error)}")

    def _on_clip(
        self, name: str, parameters: list[torch.Tensor], args: tuple, kwargs: dict
    ) -> None:
        """Read the step before the script clips its gradients."""
        try:
            stepped = [p for p in parameters if isinstance(p, torch.Tensor) and p.grad is not None]
            if not stepped:
                return
            first = max(self._step_counts.values(), default=0)
            entries = self._models_holding(stepped, first, f"{name}()")
            if not self.optimizer_steps and any(e.read_early is not None for e in entries):
                # A step went by with no optimizer step: the weights are updated by hand.
                self._stop_search_when_done()
        except Exception as error:  # never into the script
            self._warn_once("find", f"cannot find the models: {self._internal(error)}")
            return
        loss = None
        for entry in entries:
            # a second clipping of the same gradients (by norm, then by value) reads nothing
            if entry.failed or entry.read_early == self.losses.backwards:
                continue
            if loss is None:
                loss = self.losses.take()
            self._note_clipping(entry, name, args, kwargs)
            self._collect(entry, loss, self._scaler, None)
            # (a script that updates its weights by hand has no optimizer step: the next
            # backward starts the next step)
            entry.read_early = self.losses.backwards

    def _collect(
        self,
        entry: WatchedModel,
        loss: torch.Tensor | None,
        scaler: Any,
        optimizer: torch.optim.Optimizer | None,
    ) -> None:
        if entry.failed:
            return
        watch = entry.watch
        calls = self.finder.take_calls(entry.model, watch.replay)
        try:
            if scaler is not None and watch.scaler is not scaler:
                watch.scaler = scaler  # its figures are then of the unscaled gradients
            if optimizer is not None and all(o is not optimizer for o in watch.optimizers):
                watch.optimizers.append(optimizer)  # which ones unscale_ ran for
            # The watch locates a NaN/Inf by itself: it captured this step's forward.
            stats = watch.collect(loss, batch=calls_as_batch(calls))
            entry.skipped += bool(stats.skipped)
        except Exception as error:
            entry.failed = True
            say(
                f"stopped watching {model_name(entry.model)}: "
                f"{self._internal(error)}; the script goes on"
            )

    def _note_clipping(self, entry: WatchedModel, name: str, args: tuple, kwargs: dict) -> None:
        if name in entry.clipping or entry.watch is None:
            return
        limit = args[0] if args else next(iter(kwargs.values()), None)
        said = entry.clipping[name] = f"{name}({limit})" if limit is not None else f"{name}()"
        if entry.watch.recording is not None:
            entry.watch.recording.set_info(
                "clipping",
                ", ".join(entry.clipping.values()) + " by the script; the figures and "
                "statuses are those before clipping",
            )
        say(f"{model_name(entry.model)}: the script clips ({said}); read before it clips")

    def _models_of(self, optimizer: torch.optim.Optimizer, index: int) -> list[WatchedModel]:
        key = id(optimizer)
        known = self._resolved.get(optimizer)
        if known is not None:
            return [self.models[k] for k in known]
        stepped = [
            p for group in optimizer.param_groups for p in group["params"] if p.grad is not None
        ]
        if not stepped:
            return []
        entries = self._models_holding(stepped, index, type(optimizer).__name__)
        if not entries:
            self.finder.start_search()
            return []
        for entry in entries:
            entry.optimizers.add(key)
        self._resolved[optimizer] = [id(e.model) for e in entries]
        self._stop_search_when_done()
        return entries

    def _stop_search_when_done(self) -> None:
        """The forward hooks go once every optimizer that stepped has its models."""
        if self.finder.searching and all(seen in self._resolved for seen in self._step_counts):
            self.finder.stop_search([e.model for e in self.models.values()])
            self._search_ended_at = self.optimizer_steps

    def _models_holding(
        self, stepped: list[torch.Tensor], index: int, who: str
    ) -> list[WatchedModel]:
        """The watched models holding ``stepped`` (made at their first step)."""
        owners, unowned = self.finder.owners(stepped)
        if not owners:
            self._warn_once(
                f"unowned{who}",
                f"{who} steps parameters of no module (nn.Parameter objects outside any "
                "nn.Module, or a module neither built nor called while attach ran); "
                "looking again at its next step",
            )
            return []
        if unowned:
            self._warn_once(
                f"partly{who}",
                f"{unowned} parameter(s) {who} steps belong to no model (nn.Parameter objects "
                "outside any nn.Module); they are not watched",
            )
        entries = []
        for model in owners:
            entry = self.models.get(id(model))
            if entry is None:
                entry = self._watch(model, index)
            entries.append(entry)
        return entries

    def _watch(self, model: nn.Module, first_step: int) -> WatchedModel:
        import gradscope

        path = self._path_for(model)
        options: dict[str, Any] = {}
        if self.options.detail_every is not None:
            options["detail_every"] = self.options.detail_every
        if self.options.statistics:  # each watch its own instances
            options["statistics"] = [kind() for kind in self.options.statistics]
        if self.options.early_warnings:
            options["early_warnings"] = True
        tensorboard = self._tensorboard_for(model)
        name = model_name(model)
        # The capture made at the model's first training forward: step 0 is in it.
        capture = self.finder.take_capture(model)
        try:
            watch = gradscope.watch(
                model,
                self.options.layers,
                record=path,
                settings={"source": self.options.source, "attach": True},
                tensorboard=tensorboard,
                replay=capture is None,
                **options,
            )
        except GradScopeError as error:
            if capture is not None:
                capture.close()
            say(f"not watching {name}: {error}")
            entry = WatchedModel(model, None, None, failed=True)
            self.models[id(model)] = entry
            return entry
        if capture is not None:
            watch.replay = capture
        # The step's batch where the capture does not take the model's own calls (it sits
        # in the slot of the model inside a wrapper, or a compiled model's calls pass by it).
        self.finder.keep_inputs(model)
        if first_step:
            watch.step = first_step
        entry = WatchedModel(model, watch, watch.path)
        self.models[id(model)] = entry
        where = f" to {watch.path}" if watch.path is not None else ""
        layers = len(watch.layers)
        say(f"watching {name} ({layers} layer{'s' * (layers != 1)}){where}")
        if not self.finder.called(model):
            say(
                f"{name} is trained through direct .forward() calls, which no hook sees: "
                "its batches are not kept, and a NaN/Inf is located from the statistics "
                "(call the model as model(x) to have its operation and line)"
            )
        if self.options.open_app and watch.path is not None and _is_first_rank():
            self._apps.append(open_app(watch.path))
        return entry

    def _suffix_for(self, model: nn.Module) -> str:
        """ "" for the first model, ``.<Class>`` (``.<Class>2``...) for the next ones."""
        if not self.models:
            return ""
        name = model_name(model)
        taken = {e.path.name for e in self.models.values() if e.path is not None}
        suffix, number = f".{name}", 1
        while any(suffix + "." in t or t.endswith(suffix + SUFFIX) for t in taken):
            number += 1
            suffix = f".{name}{number}"
        return suffix

    def _path_for(self, model: nn.Module) -> Path:
        base = Path(self.options.record).expanduser()
        suffix = self._suffix_for(model)
        stem = base.name[: -len(SUFFIX)] if base.name.endswith(SUFFIX) else base.name
        return base.with_name(f"{stem}{suffix}{SUFFIX}")

    def _tensorboard_for(self, model: nn.Module) -> Path | None:
        if self.options.tensorboard is None:
            return None
        folder = Path(self.options.tensorboard).expanduser()
        suffix = self._suffix_for(model).lstrip(".")
        if _world_size() > 1:
            rank = torch.distributed.get_rank()
            suffix = f"{suffix}.rank{rank}" if suffix else f"rank{rank}"
        return folder / suffix if suffix else folder

    # -- messages ---------------------------------------------------------------------
    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            say(message)

    @staticmethod
    def _internal(error: BaseException) -> str:
        if isinstance(error, GradScopeError):
            return str(error)
        frames = traceback.format_exception(type(error), error, error.__traceback__)
        return "".join(frames).rstrip() + "\n(a bug in GradScope; please report it)"

    # -- the end ----------------------------------------------------------------------
    def close(self) -> None:
        """Remove every hook and close every watch (their recordings are flushed)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.losses.uninstall()
        self.calls.uninstall()
        self.finder.close()
        for entry in self.models.values():
            if entry.watch is not None:
                try:
                    entry.watch.close()
                except Exception as error:
                    say(f"closing the watch of {model_name(entry.model)}: {error}")

    def summary(self) -> list[str]:
        """One line per watched model: steps, where it went, the first NaN/Inf."""
        lines = []
        for entry in self.models.values():
            if entry.watch is None:
                continue
            name = model_name(entry.model)
            steps = entry.watch.step
            line = f"{name}: {steps} step(s)"
            if entry.skipped:
                line += f" ({entry.skipped} skipped by the GradScaler)"
            if entry.path is not None:
                line += f" recorded to {entry.path}"
            lines.append(line)
            origin = entry.watch.first_origin
            if origin is not None:
                lines.append(f"  first non-finite value: {origin.describe()}")
            for warning in self._warnings_of(entry):
                lines.append(f"  early warning: {warning.describe()}")
        if not lines and not self.optimizer_steps:
            lines.append(
                "the script called no optimizer.step(): nothing was recorded (weights "
                "updated by hand, p.data.add_(...), are not seen)"
            )
        elif not lines:
            lines.append(
                "no optimizer.step() stepped the parameters of a module called in forward: "
                "nothing was recorded"
            )
        return lines

    @staticmethod
    def _warnings_of(entry: WatchedModel) -> list[Any]:
        early = None if entry.watch is None else entry.watch.early_warnings
        return [] if early is None else early.warnings

    @property
    def warned(self) -> bool:
        """Whether a watch gave an early warning (``--fail-on-warning``)."""
        return any(self._warnings_of(entry) for entry in self.models.values())

    @property
    def nonfinite(self) -> bool:
        return any(
            e.watch is not None and (e.watch.origins or (e.watch.last and e.watch.last.nonfinite))
            for e in self.models.values()
        )


def model_name(model: nn.Module) -> str:
    """The class of the model inside any wrapper (DDP, ``torch.compile``)."""
    return type(unwrap_model(model)).__name__


def _world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def _is_first_rank() -> bool:
    return _world_size() == 1 or torch.distributed.get_rank() == 0
