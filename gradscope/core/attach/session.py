"""The attach engine: one watch per model a script's optimizers step, fed at every
``optimizer.step()``.

torch calls the global optimizer-step pre-hook at the start of each ``optimizer.step()``,
after whatever the script did to the gradients before it (``scaler.unscale_``, clipping):
those are the gradients this reads. The stepped parameters (those with a gradient) are
matched to the models owning them (:mod:`.model_finder`); each model gets its own watch and
recording, the first at the path asked for, the others beside it named after their class
(``x.gsrec``, ``x.Discriminator.gsrec``): a GAN's generator and discriminator are two runs
of their own, each with its own step numbering. A model's step N is the (N+1)-th
``optimizer.step()`` that stepped it. A step a GradScaler skips calls no
``optimizer.step()`` and is not recorded.

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


@dataclass
class WatchedModel:
    model: nn.Module
    watch: Any
    path: Path | None
    optimizers: set[int] = field(default_factory=set)
    failed: bool = False


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

    def start(self) -> None:
        self.finder.start_search()
        self.losses.install()
        from torch.optim.optimizer import register_optimizer_step_pre_hook as register

        self._hook = register(self._before_step)

    # -- at each optimizer.step() -----------------------------------------------------
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
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
            if entry.failed:
                continue
            calls = self.finder.take_calls(entry.model)
            try:
                # The watch locates a NaN/Inf by itself: it captured this step's forward.
                entry.watch.collect(loss, batch=calls_as_batch(calls))
            except Exception as error:
                entry.failed = True
                say(
                    f"stopped watching {model_name(entry.model)}: "
                    f"{self._internal(error)}; the script goes on"
                )

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
        owners, unowned = self.finder.owners(stepped)
        if not owners:
            self._warn_once(
                f"unowned{key}",
                f"{type(optimizer).__name__} steps parameters of no module called in forward "
                "yet; looking again at its next step",
            )
            self.finder.start_search()
            return []
        if unowned:
            self._warn_once(
                f"partly{key}",
                f"{unowned} parameter(s) {type(optimizer).__name__} steps belong to no model "
                "called in forward; they are not watched",
            )
        entries = []
        for model in owners:
            entry = self.models.get(id(model))
            if entry is None:
                entry = self._watch(model, index)
            entry.optimizers.add(key)
            entries.append(entry)
        self._resolved[optimizer] = [id(e.model) for e in entries]
        if all(seen in self._resolved for seen in self._step_counts):
            self.finder.stop_search()
        return entries

    def _watch(self, model: nn.Module, first_step: int) -> WatchedModel:
        import gradscope

        path = self._path_for(model)
        options: dict[str, Any] = {}
        if self.options.detail_every is not None:
            options["detail_every"] = self.options.detail_every
        if self.options.statistics:  # each watch its own instances
            options["statistics"] = [kind() for kind in self.options.statistics]
        tensorboard = self._tensorboard_for(model)
        name = model_name(model)
        try:
            watch = gradscope.watch(
                model,
                self.options.layers,
                record=path,
                settings={"source": self.options.source, "attach": True},
                tensorboard=tensorboard,
                **options,
            )
        except GradScopeError as error:
            say(f"not watching {name}: {error}")
            entry = WatchedModel(model, None, None, failed=True)
            self.models[id(model)] = entry
            return entry
        if first_step:
            watch.step = first_step
        entry = WatchedModel(model, watch, watch.path)
        self.models[id(model)] = entry
        self.finder.watch_inputs(model)
        where = f" to {watch.path}" if watch.path is not None else ""
        layers = len(watch.layers)
        say(f"watching {name} ({layers} layer{'s' * (layers != 1)}){where}")
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
            if entry.path is not None:
                line += f" recorded to {entry.path}"
            lines.append(line)
            origin = entry.watch.first_origin
            if origin is not None:
                lines.append(f"  first non-finite value: {origin.describe()}")
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
