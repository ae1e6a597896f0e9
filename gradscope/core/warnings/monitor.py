"""The series of every watched quantity, by (module, quantity), and the warnings the
detectors find in them: one per module and kind, at the first step it shows."""

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import torch

from gradscope.core.facts import EarlyWarning
from gradscope.core.warnings import drift, headroom, limits, spike
from gradscope.core.warnings.hints import hint_for

# "magnitude": a positive size (max |x|, an RMS, a loss), compared on a log scale, limited by
# its dtype's overflow and smallest normal. "exponent": the input of an exp (a log-partition,
# an attention logit fed to a hand-written softmax), compared as it is, limited by exp's
# overflow point in its dtype.
MAGNITUDE = "magnitude"
EXPONENT = "exponent"

DETECTORS = ("headroom", "spike", "drift")
_KEPT = max(drift.WINDOW, 64)  # samples of history per quantity (the spike's median reads all)


@dataclass(frozen=True)
class Observation:
    """One quantity's value at a step: ``module`` as in ``named_modules()`` (None for the
    whole model, e.g. the loss); ``dtype`` the tensor's, whose limits apply (None: none)."""

    module: str | None
    quantity: str
    value: float
    dtype: torch.dtype | None = None
    scale: str = MAGNITUDE
    # The detectors that read it: "headroom", "spike", "drift".
    detectors: tuple[str, ...] = DETECTORS
    module_type: str | None = None  # its class name, for the hint


@dataclass
class _Series:
    steps: deque
    values: deque  # on the comparison scale
    # The highest value before the drift's window, over the whole run: a drift must climb
    # beyond it (a quantity coming back to where it started is not drifting).
    peak_before: float = -math.inf

    @classmethod
    def empty(cls) -> "_Series":
        return cls(deque(maxlen=_KEPT), deque(maxlen=_KEPT))

    def append(self, step: int, value: float) -> None:
        self.steps.append(step)
        self.values.append(value)
        if len(self.values) > drift.WINDOW:
            self.peak_before = max(self.peak_before, self.values[-drift.WINDOW - 1])


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _where(observation: Observation) -> str:
    if observation.module is None:
        return observation.quantity
    return f"{observation.module or '(model)'} {observation.quantity}"


def _figure(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e5 else f"{value:.2e}"


class EarlyWarnings:
    """Feed it each step's observations (``observe``); it returns the warnings new at that
    step and keeps them all in ``warnings``. A module warns once per kind: a drift that goes
    on is one warning, not one a step."""

    def __init__(self) -> None:
        self.warnings: list[EarlyWarning] = []
        self._series: dict[tuple[str | None, str], _Series] = {}
        self._raised: set[tuple[str | None, str]] = set()

    def observe(self, step: int, observations: Iterable[Observation]) -> list[EarlyWarning]:
        new: list[EarlyWarning] = []
        for observation in observations:
            new.extend(self._observe_one(step, observation))
        self.warnings.extend(new)
        return new

    def _observe_one(self, step: int, observation: Observation) -> list[EarlyWarning]:
        value = observation.value
        if not math.isfinite(value):
            return []  # a NaN/Inf is the watch's own alarm, with its origin
        if observation.scale == MAGNITUDE:
            if value <= 0:
                return []
            scaled = math.log(value)
        else:
            scaled = value
        key = (observation.module, observation.quantity)
        series = self._series.setdefault(key, _Series.empty())
        # Most steps of most quantities cannot spike: not 2x above their history's minimum
        # (hence its median); the median is taken only when it might (microseconds a step).
        history = None
        kept = len(series.values)
        if kept >= spike.MIN_HISTORY and scaled >= min(series.values) + spike.MIN_RISE:
            history = np.fromiter(series.values, float, kept)
        series.append(step, scaled)
        wanted = observation.detectors
        found = [
            self._headroom(step, observation) if "headroom" in wanted else None,
            self._spike(step, observation, history, scaled)
            if "spike" in wanted and history is not None
            else None,
            self._drift(step, observation, series) if "drift" in wanted else None,
        ]
        new = []
        for warning in found:
            if warning is None or (observation.module, warning.kind) in self._raised:
                continue
            self._raised.add((observation.module, warning.kind))
            new.append(warning)
        return new

    def _warning(
        self,
        step: int,
        observation: Observation,
        kind: str,
        evidence: str,
        limit: float | None = None,
        steps_left: int | None = None,
    ) -> EarlyWarning:
        warning = EarlyWarning(
            step,
            observation.module,
            kind,
            observation.quantity,
            observation.value,
            limit,
            evidence,
            steps_left,
        )
        return replace(warning, hint=hint_for(warning, observation.module_type))

    def _limit(self, observation: Observation) -> float | None:
        """The limit in natural units (None: none known)."""
        dtype = observation.dtype
        if dtype is None or not dtype.is_floating_point:
            return None
        if observation.scale == MAGNITUDE:
            return limits.overflow(dtype)
        return limits.exp_overflow(dtype)

    def _limit_words(self, observation: Observation, limit: float) -> str:
        dtype = _dtype_name(observation.dtype)
        if observation.scale == MAGNITUDE:
            return f"{dtype} overflows at {_figure(limit)}"
        return f"{dtype} exp overflows at {limit:.2f}"

    def _headroom(self, step: int, observation: Observation) -> EarlyWarning | None:
        limit = self._limit(observation)
        if limit is None:
            return None
        value = observation.value
        if observation.scale == MAGNITUDE:
            room = headroom.overflow_headroom(math.log(value), math.log(limit))
            if headroom.is_low(room):
                words = f"{_where(observation)} {_figure(value)}, {math.exp(room):.2g}x below "
                evidence = words + self._limit_words(observation, limit)
                return self._warning(step, observation, "low headroom", evidence, limit)
            tiny = limits.smallest_normal(observation.dtype)
            under = headroom.overflow_headroom(math.log(value), math.log(tiny))
            if headroom.is_low(-under):
                evidence = (
                    f"{_where(observation)} {_figure(value)}, within {value / tiny:.2g}x of "
                    f"{_dtype_name(observation.dtype)}'s smallest normal {tiny:.3g}: "
                    "smaller values lose precision and flush to zero"
                )
                return self._warning(step, observation, "low headroom", evidence, tiny)
            return None
        room = headroom.overflow_headroom(value, limit)
        if not headroom.is_low(room):
            return None
        evidence = (
            f"{_where(observation)} {value:.2f}, {room:.2f} below the point where "
            + self._limit_words(observation, limit)
        )
        return self._warning(step, observation, "low headroom", evidence, limit)

    def _spike(
        self, step: int, observation: Observation, history: np.ndarray, scaled: float
    ) -> EarlyWarning | None:
        found = spike.find_spike(history, scaled)
        if found is None:
            return None
        if observation.scale == MAGNITUDE:
            median = math.exp(found.median)
            times = f"{observation.value / median:.3g}x"
        else:
            median = found.median
            times = f"+{observation.value - median:.3g} over"
        z = "robust z > 1000" if found.z > 1000 else f"robust z {found.z:.0f}"
        evidence = (
            f"{_where(observation)} {_figure(observation.value)}, {times} its running "
            f"median {_figure(median)} over the last {len(history)} samples ({z})"
        )
        return self._warning(step, observation, "spiking", evidence)

    def _drift(self, step: int, observation: Observation, series: _Series) -> EarlyWarning | None:
        limit = self._limit(observation)
        scaled_limit = None
        if limit is not None:
            scaled_limit = math.log(limit) if observation.scale == MAGNITUDE else limit
        if len(series.values) < drift.WINDOW + drift.BASELINE:
            return None
        window = list(series.values)[-drift.WINDOW :]
        # A window that spans less than half the smallest rise cannot hold a drift.
        if max(window) - min(window) < drift.MIN_SPREAD:
            return None
        steps = np.fromiter(series.steps, float, len(series.steps))
        values = np.fromiter(series.values, float, len(series.values))
        towards_limit = observation.scale == EXPONENT
        found = drift.find_drift(steps, values, scaled_limit, towards_limit=towards_limit)
        if found is None or found.current <= series.peak_before:
            return None
        span = step - found.first_step
        if observation.scale == MAGNITUDE:
            start, now = math.exp(found.first_value), math.exp(found.current)
            rate = f"doubling every {math.log(2.0) / found.slope:.0f} steps"
        else:
            start, now = found.first_value, found.current
            rate = f"+{found.slope:.2g} a step"
        evidence = (
            f"{_where(observation)} {_figure(start)} → {_figure(now)} in {span} steps, {rate}"
        )
        if found.steps_left is not None:
            evidence += (
                f"; {self._limit_words(observation, limit)} — at this rate in "
                f"~{found.steps_left} steps"
            )
            return self._warning(step, observation, "drifting", evidence, limit, found.steps_left)
        return self._warning(step, observation, "drifting", evidence, limit)
