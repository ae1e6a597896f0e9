"""NaN/Inf episodes and their origins. An episode starts at a non-finite step after a finite
one; its first step gets an origin: located by a re-run of the step with instruments when
``locate`` is given (see gradscope.core.safe_locate), from the statistics otherwise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gradscope.core.diagnosis import hint_for
from gradscope.core.facts import LayerInfo, Origin, StepStats
from gradscope.core.safe_locate import locate_safely, statistics_origin
from gradscope.core.watch.distributed import name_the_rank

# The origins a watch keeps (about 2.4 kB each); later episodes are counted, not kept.
ORIGINS_KEPT = 200


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
        statistics."""
        if not stats.nonfinite:
            self.in_episode = False
            return
        if self.in_episode:
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
        if len(self.origins) < ORIGINS_KEPT:
            self.origins.append(origin)
        else:
            self.origins_dropped += 1


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
