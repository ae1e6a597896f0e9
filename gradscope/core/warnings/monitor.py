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
# Samples of history per quantity (the spike's median reads those of its last SPAN steps).
_KEPT = max(drift.WINDOW, spike.SPAN)


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


@dataclass(frozen=True)
class LayerObservations:
    """One quantity of every watched layer at a step, as one vector: ``values[i]`` is
    ``modules[i]``'s (``named_modules()`` names), ``dtypes[i]`` its dtype. The detectors
    read the whole vector at once and build a warning only for the layers that may warn;
    what they find is what ``Observation``s of each layer would give, warning for warning."""

    modules: tuple[str, ...]
    quantity: str
    values: np.ndarray
    dtypes: tuple[torch.dtype | None, ...]
    scale: str = MAGNITUDE
    detectors: tuple[str, ...] = DETECTORS
    module_types: tuple[str | None, ...] | None = None

    def observation(self, index: int) -> Observation:
        """Layer ``index``'s value as a scalar observation (for a warning's words)."""
        kind = None if self.module_types is None else self.module_types[index]
        return Observation(
            self.modules[index],
            self.quantity,
            float(self.values[index]),
            self.dtypes[index],
            self.scale,
            self.detectors,
            kind,
        )


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


class _LayerSeries:
    """The last ``_KEPT`` samples of one quantity of many layers, a ring per column: column
    ``j`` holds its ``count[j]`` samples so far (the latest ``_KEPT``), written at row
    ``count[j] % _KEPT``; a layer whose value was not finite (or not positive, for a
    magnitude) at a step has no sample there, as a scalar series skips it."""

    def __init__(self, modules: tuple[str, ...]) -> None:
        width = len(modules)
        self.modules = modules
        self.steps = np.zeros((_KEPT, width))
        self.values = np.full((_KEPT, width), np.nan)
        self.count = np.zeros(width, dtype=np.int64)
        self.peak_before = np.full(width, -math.inf)

    def reindexed(self, modules: tuple[str, ...]) -> "_LayerSeries":
        """The same history for another set of layers (the watched layers changed): kept
        for the layers in both, empty for new ones."""
        fresh = _LayerSeries(modules)
        where = {name: index for index, name in enumerate(self.modules)}
        for index, name in enumerate(modules):
            old = where.get(name)
            if old is not None:
                fresh.steps[:, index] = self.steps[:, old]
                fresh.values[:, index] = self.values[:, old]
                fresh.count[index] = self.count[old]
                fresh.peak_before[index] = self.peak_before[old]
        return fresh

    def kept(self) -> np.ndarray:
        return np.minimum(self.count, _KEPT)

    def latest(self, rows: int, columns: np.ndarray) -> np.ndarray:
        """The last ``rows`` samples of ``columns``, oldest first: shape (rows,
        len(columns)); NaN where a column has fewer."""
        back = np.arange(rows - 1, -1, -1)[:, None]
        where = (self.count[columns][None, :] - 1 - back) % _KEPT
        return self.values[where, columns[None, :]]

    def column(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Column ``index``'s kept steps and values, oldest first."""
        count = int(self.count[index])
        kept = min(count, _KEPT)
        rows = np.arange(count - kept, count) % _KEPT
        return self.steps[rows, index], self.values[rows, index]

    def append(self, step: int, scaled: np.ndarray, valid: np.ndarray) -> None:
        columns = np.flatnonzero(valid)
        rows = self.count[columns] % _KEPT
        self.values[rows, columns] = scaled[columns]
        self.steps[rows, columns] = step
        self.count[columns] += 1
        # As _Series.append: past the window, the sample that left it counts towards the peak.
        past = columns[self.count[columns] > drift.WINDOW]
        if len(past):
            left = (self.count[past] - drift.WINDOW - 1) % _KEPT
            self.peak_before[past] = np.maximum(self.peak_before[past], self.values[left, past])


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
        self._layer_series: dict[str, _LayerSeries] = {}
        # The limits of each column, by the dtypes of a quantity's layers (they rarely change).
        self._bounds: dict[tuple[tuple[torch.dtype | None, ...], str], np.ndarray] = {}
        self._raised: set[tuple[str | None, str]] = set()

    def observe(
        self, step: int, observations: Iterable[Observation | LayerObservations]
    ) -> list[EarlyWarning]:
        new: list[EarlyWarning] = []
        for observation in observations:
            if isinstance(observation, LayerObservations):
                new.extend(self._observe_layers(step, observation))
            else:
                new.extend(self._observe_one(step, observation))
        self.warnings.extend(new)
        return new

    def _bounds_of(self, layers: LayerObservations) -> np.ndarray:
        """Per column, on the comparison scale: the overflow (row 0) and the smallest
        normal (row 1, magnitudes only); NaN where no limit is known."""
        key = (layers.dtypes, layers.scale)
        found = self._bounds.get(key)
        if found is None:
            found = np.full((2, len(layers.dtypes)), np.nan)
            for index, dtype in enumerate(layers.dtypes):
                if dtype is None or not dtype.is_floating_point:
                    continue
                if layers.scale == MAGNITUDE:
                    found[0, index] = math.log(limits.overflow(dtype))
                    found[1, index] = math.log(limits.smallest_normal(dtype))
                else:
                    found[0, index] = limits.exp_overflow(dtype)
            self._bounds[key] = found
        return found

    def _observe_layers(self, step: int, layers: LayerObservations) -> list[EarlyWarning]:
        """``_observe_one`` of each layer, the checks on the whole vector: a layer is looked
        at one by one only when some detector may warn on it."""
        values = np.asarray(layers.values, dtype=float)
        width = len(values)
        series = self._layer_series.get(layers.quantity)
        if series is None:
            series = self._layer_series[layers.quantity] = _LayerSeries(layers.modules)
        elif series.modules != layers.modules:
            series = self._layer_series[layers.quantity] = series.reindexed(layers.modules)
        with np.errstate(invalid="ignore"):
            valid = np.isfinite(values)
            if layers.scale == MAGNITUDE:
                valid &= values > 0
                # math.log, not np.log: the same bits as a scalar observation's
                scaled = np.fromiter(
                    map(math.log, np.where(valid, values, 1.0).tolist()), float, width
                )
            else:
                scaled = values
            wanted = layers.detectors
            none = np.zeros(width, dtype=bool)
            maybe_headroom = none
            if "headroom" in wanted:
                bounds = self._bounds_of(layers)
                room = bounds[0] - scaled
                maybe_headroom = (room < headroom.LOW) | (scaled - bounds[1] < headroom.LOW)
                maybe_headroom &= valid
                swung = none
                if layers.scale == EXPONENT:  # see gradscope.core.warnings.headroom
                    swung = valid & ~maybe_headroom & (room < headroom.SWING_CAP)
                swung = np.flatnonzero(swung)
            maybe_spike = none
            if "spike" in wanted:
                kept = series.kept()
                lowest = np.fmin.reduce(series.values, axis=0)
                maybe_spike = valid & (kept >= spike.MIN_HISTORY)
                maybe_spike &= scaled >= lowest + spike.MIN_RISE
            histories = {}
            for j in np.flatnonzero(maybe_spike).tolist():
                history = spike.recent_history(*series.column(j), step)
                if history is None:
                    maybe_spike[j] = False
                else:
                    histories[j] = history
            series.append(step, scaled, valid)
            rises: dict[int, float] = {}  # the swung columns' largest recent rises
            if "headroom" in wanted and len(swung):
                found = headroom.largest_rise(series.latest(headroom.SWING_SAMPLES, swung))
                rises = dict(zip(swung.tolist(), found.tolist(), strict=True))
                with np.errstate(invalid="ignore"):
                    maybe_headroom[swung] = room[swung] < headroom.SWING_TIMES * found
            maybe_drift = none
            if "drift" in wanted:
                maybe_drift = valid & (series.kept() > drift.MIN_WINDOW)
                columns = np.flatnonzero(maybe_drift)
                if len(columns):
                    # The last WINDOW samples hold any window (unfilled rows are NaN).
                    window = series.latest(drift.WINDOW, columns)
                    spread = np.fmax.reduce(window, axis=0) - np.fmin.reduce(window, axis=0)
                    maybe_drift[columns[spread < drift.MIN_SPREAD]] = False
        new: list[EarlyWarning] = []
        for index in np.flatnonzero(maybe_headroom | maybe_spike | maybe_drift).tolist():
            observation = layers.observation(index)
            found = [
                self._headroom(step, observation, rises.get(index, math.nan))
                if maybe_headroom[index]
                else None,
                self._spike(step, observation, histories[index], float(scaled[index]))
                if maybe_spike[index]
                else None,
                self._drift_of(step, observation, *series.column(index), series.peak_before[index])
                if maybe_drift[index]
                else None,
            ]
            new.extend(self._first_of_their_kind(observation.module, found))
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
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series.empty()
        # Most steps of most quantities cannot spike: not 2x above their history's minimum
        # (hence its median); the median is taken only when it might (microseconds a step).
        history = None
        kept = len(series.values)
        if kept >= spike.MIN_HISTORY and scaled >= min(series.values) + spike.MIN_RISE:
            steps = np.fromiter(series.steps, float, kept)
            values = np.fromiter(series.values, float, kept)
            history = spike.recent_history(steps, values, step)
        series.append(step, scaled)
        wanted = observation.detectors
        found = [
            self._headroom(step, observation, self._rise(observation, series))
            if "headroom" in wanted
            else None,
            self._spike(step, observation, history, scaled)
            if "spike" in wanted and history is not None
            else None,
            self._drift(step, observation, series) if "drift" in wanted else None,
        ]
        return self._first_of_their_kind(observation.module, found)

    def _first_of_their_kind(
        self, module: str | None, found: list[EarlyWarning | None]
    ) -> list[EarlyWarning]:
        """The warnings of ``found`` that ``module`` has not raised before, by kind (a drift
        that goes on is one warning, not one a step), noted as raised."""
        new = []
        for warning in found:
            if warning is None or (module, warning.kind) in self._raised:
                continue
            self._raised.add((module, warning.kind))
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

    def _rise(self, observation: Observation, series: _Series) -> float:
        """The largest rise between consecutive samples of an exp input's recent ones (NaN:
        too few, or none, or not an exp input), looked for only where the room to the limit
        is small enough for a swing to matter."""
        limit = self._limit(observation)
        if limit is None or observation.scale != EXPONENT:
            return math.nan
        if len(series.values) < headroom.SWING_MIN:
            return math.nan
        if not limit - series.values[-1] < headroom.SWING_CAP:
            return math.nan
        recent = list(series.values)[-headroom.SWING_SAMPLES :]
        return float(headroom.largest_rise(np.array(recent)[:, None])[0])

    def _headroom(
        self, step: int, observation: Observation, rise: float = math.nan
    ) -> EarlyWarning | None:
        """Low headroom: within a fixed margin of the limit, or (an exp input) within two of
        the value's largest recent rises (``rise``) of its overflow."""
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
        if not (headroom.is_low(room) or headroom.swings_over(room, rise)):
            return None
        side = f"{room:.2f} below" if room >= 0 else f"{-room:.2f} above"
        evidence = (
            f"{_where(observation)} {value:.2f}, {side} the point where "
            + self._limit_words(observation, limit)
        )
        if not headroom.is_low(room):
            evidence += (
                f"; it rose by up to {rise:.2f} between two of its recent samples, and "
                "twice that crosses it"
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
        if len(series.values) <= drift.MIN_WINDOW:
            return None
        window = list(series.values)[-drift.WINDOW :]  # holds any window
        # A window that spans less than half the smallest rise cannot hold a drift.
        if max(window) - min(window) < drift.MIN_SPREAD:
            return None
        steps = np.fromiter(series.steps, float, len(series.steps))
        values = np.fromiter(series.values, float, len(series.values))
        return self._drift_of(step, observation, steps, values, series.peak_before)

    def _drift_of(
        self,
        step: int,
        observation: Observation,
        steps: np.ndarray,
        values: np.ndarray,
        peak_before: float,
    ) -> EarlyWarning | None:
        """The drift warning of a series (``steps``, ``values`` oldest first, on the
        comparison scale), or None."""
        limit = self._limit(observation)
        scaled_limit = None
        if limit is not None:
            scaled_limit = math.log(limit) if observation.scale == MAGNITUDE else limit
        towards_limit = observation.scale == EXPONENT
        found = drift.find_drift(
            steps, values, scaled_limit, towards_limit=towards_limit, peak_before=peak_before
        )
        if found is None:
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
