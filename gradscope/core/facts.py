"""The plain facts of a watched step, shared by the engine and every sink: status codes,
the watched layers, a step's statistics, a NaN/Inf origin and the per-rank facts.

This module imports nothing of GradScope's: the watch, the origin finder, the diagnosis, the
history and the recording format all depend on it, and none of them needs another to name
what a step produced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

# Ordered by severity, so the worst status of a layer over steps is their maximum: a layer
# that is frozen or got no gradient is less alarming than one that is ok.
# "skipped": the layer's scaled gradients overflowed on a step that the loss scaler skips (an
# expected event in mixed precision, not a failure).
(
    STATUS_FROZEN,
    STATUS_NO_GRADIENT,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_VANISHING,
    STATUS_EXPLODING,
    STATUS_NONFINITE,
) = range(7)
STATUS_NAMES = (
    "frozen",
    "no gradient",
    "ok",
    "skipped",
    "vanishing",
    "exploding",
    "nonfinite",
)


def is_flagged(status: np.ndarray | int) -> np.ndarray | bool:
    """Statuses worth an alarm: vanishing, exploding, nonfinite."""
    return np.asarray(status) >= STATUS_VANISHING


@dataclass
class RankFacts:
    """Per rank (indexed by rank): the loss (NaN when not given), whether it was given, and
    whether the rank's own batch or loss held NaN/Inf."""

    loss: np.ndarray
    loss_given: np.ndarray
    batch_nonfinite: np.ndarray

    @property
    def broken(self) -> list[int]:
        """Ranks whose own batch or loss went non-finite at this step."""
        bad = self.batch_nonfinite | (self.loss_given & ~np.isfinite(self.loss))
        return np.flatnonzero(bad).tolist()

    def to_dict(self) -> dict[str, Any]:
        return {
            "loss": [
                float(v) if given else None
                for v, given in zip(self.loss.tolist(), self.loss_given.tolist(), strict=True)
            ],
            "batch_nonfinite": self.batch_nonfinite.tolist(),
            "broken": self.broken,
        }


@dataclass(frozen=True)
class LayerInfo:
    """A watched layer: a module and the parameters its statistics cover."""

    name: str
    type_name: str
    param_names: tuple[str, ...]
    num_params: int
    # Parameters this layer shares with a layer listed before it (tied weights): their
    # gradients are in this layer's statistics, their count is in the earlier layer's.
    tied: tuple[str, ...] = ()


@dataclass
class StepStats:
    """One step's statistics, as plain numpy (safe to send across threads and processes).

    Arrays are indexed like ``GradientWatch.layers`` (per layer) or
    ``GradientWatch.param_names`` (per parameter). ``update_ratio`` is None until the
    optimizer step it measures has run (and stays None when the option is off).
    ``origin``: where this step's NaN/Inf came from, on the first step of each NaN/Inf
    episode (None on every other step).

    ``figures[name]``: a named statistic's (``gradscope.Statistic``) value per layer, on
    the steps it is due. Where it does not apply to a layer (it returned None for every
    parameter or forward call of the layer, or the module did not run), the value is NaN
    and ``absent[name]`` (a bool mask per layer, present only when some layer is absent at
    this step) is True: not a measurement, so the history, the recording, ``report
    --json`` (null), CSV (an empty cell) and TensorBoard/W&B (no point) show it as missing.
    """

    step: int
    loss: float | None
    total_grad_norm: float
    grad_norm: np.ndarray
    # None on steps without detail (see ``GradientWatch(detail_every=...)``).
    max_abs: np.ndarray | None
    weight_norm: np.ndarray | None
    nan_count: np.ndarray
    inf_count: np.ndarray
    status: np.ndarray
    param_grad_norm: np.ndarray
    update_ratio: np.ndarray | None = None
    loss_nonfinite: bool = False
    unwatched_nonfinite: bool = False
    origin: Origin | None = None
    # Mixed precision with a loss scaler (``watch(model, scaler=...)``): the scale of this
    # step; whether its scaled gradients overflowed so that the scaler skips it (an expected
    # event: not ``nonfinite``); whether the scale has collapsed (a real failure).
    loss_scale: float | None = None
    skipped: bool = False
    scale_collapsed: bool = False
    # Under torch.distributed: every rank's loss and whether its own batch or loss went
    # non-finite (``ranks.broken``), from the step's one all_gather.
    ranks: RankFacts | None = None
    # Why a layer that turned vanishing at this step has a tiny gradient, where the model
    # shows it cheaply (a zero or tiny scale after it in its block), by layer name.
    tiny_reasons: dict[str, str] | None = None
    # When the step was collected (seconds since the epoch, ``time.time()``): the app's
    # wall-clock axis. None for steps stored without it (older recordings).
    wall_time: float | None = None
    # Whether the step is non-finite, as the watch decided it when it made the step (None:
    # work it out from the fields; see ``nonfinite``).
    known_nonfinite: bool | None = None
    # Per-layer figures of the named statistics beyond the built-in fields (a user's
    # gradscope.Statistic), by name: one per watched layer, on the steps each is due only.
    figures: dict[str, np.ndarray] = field(default_factory=dict)
    # Where a named statistic does not apply (it gave None for every contribution of a
    # layer at this step): a bool mask per layer, by name, only for statistics with such a
    # layer at this step; ``figures[name]`` holds NaN there, and every sink shows it as
    # missing (never as a value). A real NaN (a NaN gradient's figure) is not in the mask.
    absent: dict[str, np.ndarray] = field(default_factory=dict)
    # The early warnings new at this step (``GradientWatch(early_warnings=True)``).
    warnings: list[EarlyWarning] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # What a NaN/Inf episode led to at this later step of it, as (kind, layer, message)
    # events: weights its gradients spoiled, say. Consequences, not origins of their own.
    episode_events: list[tuple[str, str | None, str]] | None = None

    @property
    def nonfinite(self) -> bool:
        """True when anything of this step, watched or not, is NaN or Inf (a step the loss
        scaler skips is not, unless the scale has collapsed)."""
        if self.known_nonfinite is not None:
            return self.known_nonfinite
        return (
            self.scale_collapsed
            or self.loss_nonfinite
            or self.unwatched_nonfinite
            or bool((self.status == STATUS_NONFINITE).any())
        )


# How many samples an input origin's description lists.
SAMPLES_SHOWN = 5


# Keys the sinks already give a layer beside its statistics (the JSON report's layer entry,
# the CSV's columns): a statistic may not take one of these names, or it would be dropped there.
RESERVED_STATISTIC_NAMES = frozenset(
    {
        "name",
        "type",
        "params",
        "status",
        "status_first_seen_step",
        "last_status",
        "finite_max_grad_norm",
        "why_tiny",
        "step",
        "layer",
    }
)


@dataclass(frozen=True)
class StatisticInfo:
    """What a sink needs to know of a statistic, by its name (its column, JSON key, tag and
    menu entry): ``label``, what the app's selector shows; ``combine``, how a layer's figure
    follows from its parameters' ("sum", "max", "rss" root of summed squares, or "mean");
    ``every``, its schedule in steps (measured at steps 0, every, 2*every, ...); ``source``,
    what it reads ("parameter": gradients and weights, "output": a module's forward output).
    Its figures are ``StepStats.figures[name]``, one per watched layer, on the steps it is
    due and absent on the others."""

    name: str
    label: str = ""
    combine: str = "rss"
    every: int = 1
    source: str = "parameter"

    @property
    def shown_as(self) -> str:
        return self.label or self.name


@dataclass
class SourceLocation:
    file: str
    line: int
    code: str


@dataclass
class Origin:
    """The first non-finite value of a step.

    ``phase``: "input" (the batch itself held it), "forward", "loss" or "backward"; "unknown"
    when the diagnosis re-run could not say (``details["reason"]`` says why and what to do);
    or "update" when the weights were already non-finite before the step's forward (an
    optimizer update wrote them; ``step`` is then the step whose update did it and ``tensor``
    the parameter's name). ``module``: dotted module path ("" is the root), None when the
    value was made outside the model (loss code) or came with the batch.
    ``tensor``: "output", "input grad", "<param>.grad" (relative to the module), "loss", or
    for the input phase the path in the batch (``inputs[0]``, ``inputs["numeric"]``,
    ``target``). ``kind``: "nan" or "inf".
    ``op``, ``file``, ``line`` and ``code`` name the operation and the line of user code that
    made it, when the tracer saw it.
    """

    step: int
    phase: str
    module: str | None
    tensor: str
    kind: str
    op: str | None = None
    file: str | None = None
    line: int | None = None
    code: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.phase == "unknown":
            reason = self.details.get("reason") or "the re-run did not say"
            return f"step {self.step}: {self.kind.upper()}, origin not located: {reason}"
        if self.phase == "input":
            bad = self.details.get("count")
            kind = "NaN" if self.kind == "nan" else "Inf"
            called = self.details.get("source", "batch") != "batch"
            text = (
                f"step {self.step}: {kind} in the batch (your data), not in the model or the "
                f"loss: {self.tensor}" + (" (the model's call argument)" if called else "")
            )
            if bad:
                text += f" holds {bad} {kind}"
                samples = self.details.get("samples") or []
                if samples:
                    shown = ", ".join(str(s) for s in samples[:SAMPLES_SHOWN])
                    more = "..." if len(samples) > SAMPLES_SHOWN else ""
                    text += f" in sample{'s' if len(samples) > 1 else ''} {shown}{more}"
            return text
        if self.phase == "update" and self.details.get("at_start"):
            return (
                f"step {self.step}: the weights of module {self.module or '(model root)'!r} "
                f"were already {self.kind.upper()} at the first step (never initialised, or "
                "loaded so)"
            )
        if self.phase == "loss" and self.module is None and self.details.get("reproduced") is False:
            # From the statistics alone: the loss was non-finite, but nothing says who made it.
            return (
                f"step {self.step}: the loss was {self.kind.upper()} (not re-run: the model's "
                "forward or the loss code made it)"
            )
        where = (
            "outside the model (loss code)"
            if self.module is None
            else (f"module {self.module or '(model root)'!r}")
        )
        if (self.details.get("evidence") or {}).get("default_loss"):
            where = "GradScope's default loss (your script has no loss_fn)"
        text = (
            f"step {self.step}: first {self.kind.upper()} in {self.phase}, {where}, {self.tensor}"
        )
        if self.op:
            text += f", op {self.op}"
        if self.file:
            text += f" at {self.file}:{self.line}"
            if self.code:
                text += f"  ({self.code.strip()})"
        return text


class WatchView(Protocol):
    """What a sink may read of the watch that hands it a step (``on_step(watch, stats)``):
    the model, the watched layers and the options that shape what a step holds. Sinks only
    store or show what the watch computed; they never recompute."""

    model: Any
    layers: list[LayerInfo]
    param_names: list[str]
    update_ratio_enabled: bool

    @property
    def on_every_rank(self) -> bool: ...


# The kinds of an early warning (#37): a quantity far above its own recent history; one that
# keeps growing (towards its limit where it has one); one close to its dtype's limit.
EARLY_WARNING_KINDS = ("spiking", "drifting", "low headroom")


@dataclass(frozen=True)
class EarlyWarning:
    """A precursor of a failure, seen before any NaN/Inf: ``module`` is the layer's name in
    ``named_modules()`` (None for a whole-model quantity such as the loss); ``quantity`` what
    was measured (e.g. "max |x|", "log-partition", "loss"); ``value`` its value at ``step``;
    ``limit`` what it must not reach (a dtype's overflow, exp's overflow point; None where
    there is none); ``steps_left`` the projected steps until it reaches ``limit`` at the rate
    seen (None where not projected); ``evidence`` the figures behind it, in words; ``hint``
    what practice does about it. Not named ``Warning``: that would shadow Python's."""

    step: int
    module: str | None
    kind: str
    quantity: str
    value: float
    limit: float | None
    evidence: str
    steps_left: int | None = None
    hint: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return f"step {self.step}: {self.kind}: {self.evidence}"
