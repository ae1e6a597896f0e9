"""NaN/Inf episodes and their origins. An episode starts at a non-finite step after a finite
one; its first step gets an origin: located by a re-run of the step with instruments when
``locate`` is given (see gradscope.core.safe_locate), from the statistics otherwise.

The later steps of an episode get no origin of their own: what they show follows from the
first (the optimizer step wrote the episode's NaN/Inf gradients into the weights, and every
later gradient comes from those weights). Weights that turn non-finite during an episode
are its events (``StepStats.episode_events``), not new origins."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gradscope.core.diagnosis import hint_for
from gradscope.core.facts import LayerInfo, Origin, StepStats
from gradscope.core.safe_locate import locate_safely, statistics_origin
from gradscope.core.watch.distributed import name_the_rank

# The origins a watch keeps (about 2.4 kB each); later episodes are counted, not kept.
ORIGINS_KEPT = 200
# An episode event about spoiled weights names this many layers, then counts the rest.
LAYERS_NAMED = 4
SPOILED_WEIGHTS = "spoiled weights"


class Episodes:
    """The watch's NaN/Inf episodes: whether one is under way, the origins of the first
    ``ORIGINS_KEPT`` (``origins``) and how many more there were (``origins_dropped``)."""

    def __init__(self, max_located: int, locate_timeout: float) -> None:
        self.max_located = max_located
        self.locate_timeout = locate_timeout
        self.origins: list[Origin] = []
        self.origins_dropped = 0
        self.located = 0
        self.in_episode = False
        # The episode's origin and, per watched layer, whether its weights are known to be
        # NaN/Inf already (None: no episode, or every layer's are).
        self._origin: Origin | None = None
        self._spoiled: np.ndarray | None = None

    def follow(
        self,
        stats: StepStats,
        *,
        model: Any,
        layers: Sequence[LayerInfo],
        locate: Callable[[], Any] | None,
        batch: Any,
        sharded: bool,
        rank: int | None,
        optimizers: Sequence[Any],
        first_collected: bool,
        replay: Any = None,
    ) -> None:
        """Give the first step of a new episode its origin: through ``locate``, else by
        repeating the step ``replay`` captured (gradscope.core.replay), else from the
        statistics. On its later steps, note the layers whose weights have turned NaN/Inf
        since (from the step's weight norms: a non-finite step always has the detail, so
        nothing more is read)."""
        if not stats.nonfinite:
            self.in_episode = False
            self._origin = self._spoiled = None
            return
        if self.in_episode:
            self._note_spoiled_weights(stats, layers, optimizers)
            return
        self.in_episode = True
        names = [layer.name for layer in layers]
        repeat = locate is None and replay is not None
        if locate is None and not repeat:
            origin = statistics_origin(stats, names)
            if sharded:
                origin.details["hint"] = (
                    "found from the statistics alone; a sharded model's step is not re-run "
                    "(its forward gathers parameters from every rank): to find the operation "
                    "and line, run the model unsharded in one process on this step's batch "
                    "with locate="
                )
        elif self.located >= self.max_located:
            origin = statistics_origin(stats, names)
            origin.details["reason"] = (
                f"not re-run: {self.max_located} NaN/Inf episodes were already located "
                "(max_located)"
            )
        else:
            self.located += 1
            if repeat:
                origin = replay.locate(
                    model, stats, names, batch=batch, timeout=self.locate_timeout
                )
            else:
                origin = locate_safely(
                    model, locate, stats, names, batch=batch, timeout=self.locate_timeout
                )
            if stats.loss_scale is not None:
                # the hints advise a loss scaler only to a loop that has none
                origin.details["loss_scaler"] = True
                if origin.details.get("hint") and origin.phase != "unknown":
                    origin.details["hint"] = hint_for(origin)
        if stats.ranks is not None and rank is not None:
            name_the_rank(origin, stats.ranks, rank)
        if stats.scale_collapsed:
            _explain_collapse(origin, stats)
        if origin.phase == "update":
            _name_the_update(origin, stats, optimizers, first_collected)
        stats.origin = origin
        self._origin = origin
        # The weights the origin step already read NaN/Inf are the origin's (an "update"
        # origin names them); only those spoiled later are the episode's events.
        norms = stats.weight_norm
        self._spoiled = None
        if norms is not None and len(norms) == len(layers):
            self._spoiled = ~np.isfinite(norms)
        if len(self.origins) < ORIGINS_KEPT:
            self.origins.append(origin)
        else:
            self.origins_dropped += 1

    def _note_spoiled_weights(
        self,
        stats: StepStats,
        layers: Sequence[LayerInfo],
        optimizers: Sequence[Any],
    ) -> None:
        spoiled, origin, norms = self._spoiled, self._origin, stats.weight_norm
        if spoiled is None or origin is None or norms is None:
            return
        if len(spoiled) != len(layers) or len(norms) != len(layers):
            return  # the watched layers changed during the episode
        bad = ~np.isfinite(norms)
        new = np.flatnonzero(bad & ~spoiled).tolist()
        spoiled |= bad
        if not new:
            return
        names = [layers[i].name or "(model)" for i in new]
        kind = "NaN" if np.isnan(norms[new]).any() else "Inf"
        listed = ", ".join(names[:LAYERS_NAMED])
        if len(names) > LAYERS_NAMED:
            listed += f" and {len(names) - LAYERS_NAMED} more"
        writer = "/".join(sorted({type(each).__name__ for each in optimizers})) or "optimizer"
        message = (
            f"step {stats.step}: {kind} weights in {listed}: {writer}.step of step "
            f"{stats.step - 1} wrote this episode's NaN/Inf gradients into them (a "
            f"consequence of the origin at step {origin.step}, not a new origin)"
        )
        stats.episode_events = [
            *(stats.episode_events or ()),
            (SPOILED_WEIGHTS, layers[new[0]].name, message),
        ]


def _explain_collapse(origin: Origin, stats: StepStats) -> None:
    origin.details["scale_collapse"] = stats.loss_scale
    collapse = (
        f"the loss scale collapsed to {stats.loss_scale:g}: the scaled gradients "
        "overflow at every scale, so the scaler skips every step"
    )
    if origin.phase == "unknown" and "finite" in origin.details.get("reason", ""):
        origin.details["reason"] = (
            f"{collapse}; the unscaled re-run was finite, so the overflow is in the "
            "half-precision backward itself: look for activations or gradients beyond "
            "65504 (normalise or clamp them, or run that layer in float32)"
        )
    else:
        origin.details.setdefault("reason", collapse)


def _name_the_update(
    origin: Origin, stats: StepStats, optimizers: Sequence[Any], first_collected: bool
) -> None:
    if first_collected:
        # Non-finite weights at the first step this watch saw: no optimizer step of its
        # wrote them; they came that way (never initialised, or loaded so).
        origin.details["at_start"] = True
        origin.op = "initialisation"
    else:
        # The weights were written by the last applied optimizer step.
        origin.step = stats.step - 1
        names = sorted({type(each).__name__ for each in optimizers})
        origin.op = f"{'/'.join(names) or 'optimizer'}.step"
    origin.details["hint"] = hint_for(origin)
