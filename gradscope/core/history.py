"""Run history: per-layer statistics of every step in preallocated numpy buffers.

Columns are layers (added when a layer is first watched), rows are steps; buffers double
when full, so appending is amortised O(layers). A cell of a step in which the layer was not
watched holds ``MISSING`` (-1: norms are never negative), never NaN, because NaN is a real
value here. Values are float32 (4 bytes per layer, step and statistic); finite values beyond
float32's range saturate at its maximum rather than turning into a false Inf.

Statistics beyond the built-in ones (``StepStats.figures``, a user's ``gradscope.Statistic``)
are kept by name beside them, with the steps each was due at (``figure_due``): such a
statistic may be negative, so its MISSING cells are only what the plots skip, and the exact
sinks (report, CSV, TensorBoard) ask ``figure_measured`` instead. Where such a statistic
did not apply to a layer (``StepStats.absent``) its cell is MISSING too, never the NaN the
step carries there (NaN is a real value), and ``figure_absent`` marks it: not measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gradscope.core.facts import (
    STATUS_NAMES,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SKIPPED,
    EarlyWarning,
    Origin,
    StatisticInfo,
    StepStats,
    is_flagged,
)

MISSING = -1.0
STATUS_MISSING = 255
STATISTICS = ("grad_norm", "max_abs", "weight_norm", "update_ratio")
GROUPED_ONSETS = 8  # more layers than this turning bad at one step make one event
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# Each parameter's gradient norm is kept in at most this many bytes (float32 cells): a model
# with 62 parameters (resnet18) keeps every step of 135,000; one with 6,000 keeps every step
# of 1,400, then every second, fourth... step of the run (see ParameterNorms).
PARAMETER_NORM_BYTES = 32 * 2**20


def _to_float32(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        narrowed = values.astype(np.float32)
    overflowed = np.isinf(narrowed)
    if overflowed.any():  # rare: only finite values beyond float32's range are fixed up
        finite = overflowed & np.isfinite(values)
        narrowed[finite] = np.copysign(_FLOAT32_MAX, values[finite])
    return narrowed


@dataclass(frozen=True)
class Event:
    """Something worth a line in the events list: a status onset or the NaN/Inf origin."""

    step: int
    # "exploding", "vanishing", "nonfinite", "origin", "warning" (an early warning), or an
    # episode's ("spoiled weights")
    kind: str
    layer: str | None
    message: str


def named_figures(stats: StepStats) -> dict[str, np.ndarray]:
    """The step's figures of statistics beyond the built-in ones (those keep their own
    fields and tables, so a built-in's name in ``figures`` is not kept twice)."""
    figures = stats.figures
    if not figures:
        return {}
    return {name: values for name, values in figures.items() if name not in STATISTICS}


def statistic_rows(stats: StepStats) -> np.ndarray:
    """The step's grad_norm, max_abs and weight_norm rows as float32; the statistics a step
    without detail did not measure (None) are MISSING, never NaN."""
    missing = np.full(len(stats.grad_norm), MISSING)
    return _to_float32(
        np.stack(
            (
                stats.grad_norm,
                missing if stats.max_abs is None else stats.max_abs,
                missing if stats.weight_norm is None else stats.weight_norm,
            )
        )
    )


def status_onsets(
    step: int,
    names: Sequence[str],
    status: np.ndarray,
    before: np.ndarray,
    grad_norm: np.ndarray,
) -> list[Event]:
    """Events for the layers whose status turned exploding, vanishing or nonfinite at
    ``step`` (``before``: their statuses at the previous step). When more than
    GROUPED_ONSETS layers turn bad together (a NaN spreading through the whole model) they
    make one event, named after the first of them in forward order."""
    status = np.asarray(status)
    changed = np.flatnonzero((status != before) & is_flagged(status))
    events: list[Event] = []
    for code in sorted(set(status[changed].tolist())):
        indices = changed[status[changed] == code].tolist()
        label = STATUS_NAMES[code]
        if len(indices) > GROUPED_ONSETS:
            first = names[indices[0]]
            message = f"step {step}: {len(indices)} layers {label}, from {first or '(model)'} on"
            events.append(Event(step, label, first, message))
            continue
        for index in indices:
            name = names[index]
            detail = f" (grad norm {grad_norm[index]:.3g})" if code != STATUS_NONFINITE else ""
            events.append(
                Event(step, label, name, f"step {step}: {name or '(model)'} {label}{detail}")
            )
    return events


class StatusOnsets:
    """The one computation of status onsets, for the history and the recording writer alike:
    each layer's status at the last step that measured it (ok before any), by name, and the
    events (:func:`status_onsets`) of the layers whose status turned bad since. A vanishing
    onset says why the gradient is tiny where the engine saw it (``StepStats.tiny_reasons``).

    ``key``: an object that stands for ``names`` (the writer's layer list) while it is the
    same object, so a step of the same layers looks no name up."""

    def __init__(self) -> None:
        self._column: dict[str, int] = {}
        self._previous = np.zeros(0, dtype=np.uint8)
        self._key: object = None
        self._key_columns = np.zeros(0, dtype=np.intp)

    def _columns(self, names: Sequence[str], key: object = None) -> np.ndarray:
        if key is not None and key is self._key:
            return self._key_columns
        for name in names:
            if name not in self._column:
                self._column[name] = len(self._column)
        if len(self._column) > len(self._previous):
            grown = np.full(len(self._column), STATUS_OK, dtype=np.uint8)
            grown[: len(self._previous)] = self._previous
            self._previous = grown
        columns = np.fromiter((self._column[n] for n in names), dtype=np.intp, count=len(names))
        if key is not None:
            self._key, self._key_columns = key, columns
        return columns

    def set(self, names: Sequence[str], status: np.ndarray, key: object = None) -> None:
        """The layers' statuses now (the last step read back from a recording, a rewind)."""
        columns = self._columns(names, key)  # first: it may grow ``_previous``
        self._previous[columns] = status

    def forget(self) -> None:
        """Every layer back to ok (a rewind to the start)."""
        self._previous[:] = STATUS_OK

    def step(
        self,
        step: int,
        names: Sequence[str],
        status: np.ndarray,
        grad_norm: np.ndarray,
        tiny_reasons: dict[str, str] | None = None,
        key: object = None,
    ) -> list[Event]:
        """The onsets of one step, which becomes each layer's last."""
        columns = self._columns(names, key)
        status = np.asarray(status, dtype=np.uint8)
        onsets = status_onsets(step, names, status, self._previous[columns], grad_norm)
        self._previous[columns] = status
        return _with_reasons(onsets, tiny_reasons)

    def steps(
        self,
        steps: Sequence[int],
        names: Sequence[str],
        all_stats: Sequence[StepStats],
        status: np.ndarray,
    ) -> list[Event]:
        """The onsets of several steps of the same layers (``status``: steps x layers), in
        one numpy comparison: only the steps whose statuses differ from the step before
        need a look."""
        columns = self._columns(names)
        before = np.empty_like(status)
        before[0] = self._previous[columns]
        before[1:] = status[:-1]
        events: list[Event] = []
        for row in np.flatnonzero(((status != before) & is_flagged(status)).any(axis=1)):
            stats = all_stats[row]
            onsets = status_onsets(steps[row], names, status[row], before[row], stats.grad_norm)
            events.extend(_with_reasons(onsets, stats.tiny_reasons))
        self._previous[columns] = status[-1]
        return events


def _with_reasons(onsets: list[Event], reasons: dict[str, str] | None) -> list[Event]:
    if not reasons:
        return onsets
    return [
        dataclasses.replace(e, message=f"{e.message}; why: {reasons[e.layer]}")
        if e.kind == "vanishing" and e.layer in reasons
        else e
        for e in onsets
    ]


def owner_layers(
    param_names: Sequence[str], layer_param_names: Sequence[Sequence[str]], layers: Sequence[str]
) -> list[str]:
    """The layer each parameter of ``param_names`` belongs to: the first of ``layers`` whose
    parameters (``layer_param_names``, as ``LayerInfo.param_names``) list it, as the watch
    decides which layer a tied parameter counts for."""
    owner: dict[str, str] = {}
    for layer, names in zip(layers, layer_param_names, strict=True):
        for name in names:
            owner.setdefault(name, layer)
    return [owner.get(name, "") for name in param_names]


def _elapsed(wall_time: np.ndarray) -> np.ndarray:
    """Seconds since the first of ``wall_time``; never decreasing (a clock set back by NTP
    must not make the plots' x fold back on itself)."""
    if not len(wall_time):
        return np.zeros(0)
    return np.maximum.accumulate(wall_time - wall_time[0])


class ParameterNorms:
    """Each watched parameter's gradient norm (``StepStats.param_grad_norm``), by name, at
    the history's steps, in at most ``budget_bytes``: every step while that holds them, then
    every second one, every fourth... (``stride``; the kept rows are the history rows that
    are multiples of it), so a long run is kept whole at a coarser resolution, as a
    decimated recording is. MISSING where a parameter was not watched.

    Read like a :class:`RunHistory` by the gradient-norm plot (``layer_names`` are the
    parameter names here, ``matrix`` the norms): a parameter is one more curve."""

    def __init__(self, history: RunHistory, budget_bytes: int = PARAMETER_NORM_BYTES) -> None:
        self._history = history
        self.budget_cells = max(1, budget_bytes // 4)
        self.layer_names: list[str] = []  # the parameters' names
        self.owner: list[str] = []  # the layer of each
        self._column: dict[str, int] = {}
        self.stride = 1
        self.count = 0
        self._rows = np.zeros(0, dtype=np.int64)  # history row of each kept row
        self.step_numbers = np.zeros(0, dtype=np.int64)
        self._values = np.zeros((0, 0), dtype=np.float32)

    # The history's facts at the kept rows (what the plots read beside the values).
    @property
    def rows(self) -> np.ndarray:
        return self._rows[: self.count]

    @property
    def steps(self) -> np.ndarray:
        return self.step_numbers[: self.count]

    @property
    def skipped(self) -> np.ndarray:
        return self._history.skipped[self.rows]

    @property
    def loss_scale(self) -> np.ndarray:
        return self._history.loss_scale[self.rows]

    @property
    def wall_time(self) -> np.ndarray:
        return self._history.wall_time[self.rows]

    def has_wall_time(self) -> bool:
        return self._history.has_wall_time()

    def elapsed_seconds(self) -> np.ndarray:
        """Seconds since the run's first step (the history's, so that these line up with
        the layers' curves and the loss)."""
        return self._history.elapsed_seconds()[self.rows]

    def has_layer(self, name: str) -> bool:
        return name in self._column

    def column(self, name: str) -> int:
        return self._column[name]

    def matrix(self, statistic: str = "grad_norm") -> np.ndarray:
        return self._values[: self.count, : len(self.layer_names)]

    def series(self, statistic: str, name: str) -> np.ndarray:
        return self._values[: self.count, self._column[name]]

    def status_matrix(self) -> np.ndarray:
        """Nonfinite where a norm is NaN/Inf, else ok; skipped where the owner layer's
        status is (what the plots' skipped-step markers ask: a skipped step that is also a
        failure shows as the failure). A step the loss scaler skipped overflowed as
        designed, so its parameters' norms are Inf: the layer's status, not the norm, says
        whether it also failed (the per-parameter view drew every skipped step as NaN/Inf)."""
        values = self.matrix()
        status = np.where(
            (values == MISSING) | np.isfinite(values), STATUS_OK, STATUS_NONFINITE
        ).astype(np.uint8)
        history = self._history
        owners = np.fromiter(
            (history.column(o) if history.has_layer(o) else -1 for o in self.owner),
            dtype=np.intp,
            count=len(self.owner),
        )
        if self.count and (owners >= 0).any():
            known = np.flatnonzero(owners >= 0)
            layer_status = history.status_matrix()[self.rows][:, owners[known]]
            part = status[:, known]
            part[layer_status == STATUS_SKIPPED] = STATUS_SKIPPED
            status[:, known] = part
        return status

    def params_of(self, layers: Sequence[str]) -> list[str]:
        """The parameters of ``layers``, layer by layer in their order."""
        by_layer: dict[str, list[str]] = {}
        for name, owner in zip(self.layer_names, self.owner, strict=True):
            by_layer.setdefault(owner, []).append(name)
        return [name for layer in layers for name in by_layer.get(layer, ())]

    def nbytes(self) -> int:
        return self._values.nbytes + self._rows.nbytes + self.step_numbers.nbytes

    # -- writing (by the history) --------------------------------------------------------
    def ensure(self, names: Sequence[str], owners: Sequence[str]) -> np.ndarray:
        for name, owner in zip(names, owners, strict=True):
            if name not in self._column:
                self._column[name] = len(self.layer_names)
                self.layer_names.append(name)
                self.owner.append(owner)
        return np.fromiter((self._column[n] for n in names), dtype=np.intp, count=len(names))

    def add(self, rows: np.ndarray, columns: np.ndarray, values: np.ndarray) -> None:
        """The norms ``values`` (history rows x ``columns``) of history rows ``rows``
        (increasing, after every row kept so far); those off the stride are not kept."""
        keep = rows % self.stride == 0
        rows, values = rows[keep], values[keep]
        if not len(rows):
            return
        width = len(self.layer_names)
        while (self.count + len(rows)) * max(width, 1) > self.budget_cells and (
            self.count + len(rows) > 1
        ):
            self.stride *= 2
            kept = self._rows[: self.count] % self.stride == 0
            n = int(kept.sum())
            self._rows[:n] = self._rows[: self.count][kept]
            self.step_numbers[:n] = self.step_numbers[: self.count][kept]
            self._values[:n] = self._values[: self.count][kept]
            self.count = n
            keep = rows % self.stride == 0
            rows, values = rows[keep], values[keep]
        need = self.count + len(rows)
        capacity, columns_held = self._values.shape
        if need > capacity or width > columns_held:
            new_capacity = max(need, min(2 * capacity, self.budget_cells // max(width, 1)), 16)
            grown = np.full((new_capacity, max(width, columns_held)), MISSING, dtype=np.float32)
            grown[: self.count, :columns_held] = self._values[: self.count]
            self._values = grown
            for name in ("_rows", "step_numbers"):
                old = getattr(self, name)
                new = np.zeros(new_capacity, dtype=np.int64)
                new[: self.count] = old[: self.count]
                setattr(self, name, new)
        span = slice(self.count, need)
        self._rows[span] = rows
        self.step_numbers[span] = self._history.step_numbers[rows]
        # (read back from a recording they are float32 already: no second conversion)
        values = values if values.dtype == np.float32 else _to_float32(values)
        if len(columns) == width and np.array_equal(columns, np.arange(width)):
            self._values[span, :width] = values  # every parameter, in order: a plain copy
        else:
            self._values[span] = MISSING
            self._values[span, columns] = values
        self.count = need

    def forget_from(self, row: int) -> None:
        """Forget the kept rows from history row ``row`` on (a rewind)."""
        self.count = int(np.searchsorted(self._rows[: self.count], row, side="left"))


class RunHistory:
    def __init__(self, capacity: int = 256) -> None:
        self.layer_names: list[str] = []
        self.layer_types: list[str] = []
        self.layer_params: list[int] = []
        self._column: dict[str, int] = {}
        self._capacity = max(1, capacity)
        self._layer_capacity = 0
        self.count = 0
        self.step_numbers = np.zeros(self._capacity, dtype=np.int64)
        self.loss = np.zeros(self._capacity, dtype=np.float64)
        self.total_grad_norm = np.zeros(self._capacity, dtype=np.float64)
        # Mixed precision: the loss scaler's scale at each step (0: no scaler) and whether
        # the scaler skipped the step.
        self.loss_scale = np.zeros(self._capacity, dtype=np.float64)
        self.skipped = np.zeros(self._capacity, dtype=bool)
        # When each step was collected (seconds since the epoch; NaN: not known, as in
        # recordings written before GradScope stamped steps).
        self.wall_time = np.full(self._capacity, np.nan)
        # Each parameter's gradient norm, within a memory bound (see ParameterNorms).
        self.parameter_norms = ParameterNorms(self)
        self._stats: dict[str, np.ndarray] = {
            name: np.zeros((self._capacity, 0), dtype=np.float32) for name in STATISTICS
        }
        # Named statistics beyond the built-ins (StepStats.figures), in the order first seen,
        # their values in ``_stats`` and the rows each was due at; what a sink knows of them.
        self.figure_names: list[str] = []
        self._due: dict[str, np.ndarray] = {}
        # Where a named statistic did not apply (StepStats.absent): its cells hold MISSING
        # and are not measured; kept only for statistics that ever were absent.
        self._absent: dict[str, np.ndarray] = {}
        self.statistic_infos: dict[str, StatisticInfo] = {}
        self._status = np.zeros((self._capacity, 0), dtype=np.uint8)
        self.worst_status = np.zeros(0, dtype=np.uint8)
        self.events: list[Event] = []
        self.first_nonfinite: Origin | None = None
        # Every NaN/Inf episode's origin, in order (the first is ``first_nonfinite``).
        self.origins: list[Origin] = []
        # The early warnings of the run (StepStats.warnings), each also an Event "warning".
        self.warnings: list[EarlyWarning] = []
        # Each layer's last status, for the onsets of the next step.
        self.onsets = StatusOnsets()
        # Why a layer's gradient is tiny, where the engine saw it (StepStats.tiny_reasons).
        self.tiny_reasons: dict[str, str] = {}

    # -- shape -------------------------------------------------------------------------
    def column(self, name: str) -> int:
        return self._column[name]

    def has_layer(self, name: str) -> bool:
        return name in self._column

    def ensure_layers(
        self,
        names: Sequence[str],
        types: Sequence[str] | None = None,
        params: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Column indices of ``names``, adding columns for new layers."""
        for i, name in enumerate(names):
            if name in self._column:
                continue
            self._column[name] = len(self.layer_names)
            self.layer_names.append(name)
            self.layer_types.append(types[i] if types else "")
            self.layer_params.append(int(params[i]) if params else 0)
        if len(self.layer_names) > self._layer_capacity:
            self._grow(self._capacity, max(len(self.layer_names), 2 * self._layer_capacity, 8))
        return np.fromiter((self._column[n] for n in names), dtype=np.intp, count=len(names))

    def _grow(self, rows: int, columns: int) -> None:
        def regrow(array: np.ndarray, fill: float) -> np.ndarray:
            if array.ndim == 1:
                new = np.full(rows, fill, dtype=array.dtype)
                new[: self.count] = array[: self.count]
                return new
            new = np.full((rows, columns), fill, dtype=array.dtype)
            new[: self.count, : array.shape[1]] = array[: self.count]
            return new

        for name in self._stats:
            self._stats[name] = regrow(self._stats[name], MISSING)
        for name in self._due:
            self._due[name] = regrow(self._due[name], False)
        for name in self._absent:
            self._absent[name] = regrow(self._absent[name], False)
        self._status = regrow(self._status, STATUS_MISSING)
        self.step_numbers = regrow(self.step_numbers, 0)
        self.loss = regrow(self.loss, 0.0)
        self.total_grad_norm = regrow(self.total_grad_norm, 0.0)
        self.loss_scale = regrow(self.loss_scale, 0.0)
        self.skipped = regrow(self.skipped, False)
        self.wall_time = regrow(self.wall_time, np.nan)
        worst = np.zeros(columns, dtype=np.uint8)
        worst[: len(self.worst_status)] = self.worst_status
        self.worst_status = worst
        self._capacity, self._layer_capacity = rows, columns

    # -- appending ---------------------------------------------------------------------
    def append(
        self,
        step: int,
        loss: float,
        stats: StepStats | None,
        layer_names: Sequence[str],
        layer_types: Sequence[str] | None = None,
        layer_params: Sequence[int] | None = None,
        origin: Origin | None = None,
        param_names: Sequence[str] | None = None,
        param_layers: Sequence[str] | None = None,
    ) -> None:
        """One step. ``param_names`` (``GradientWatch.param_names``, the order of
        ``stats.param_grad_norm``) and ``param_layers`` (each one's layer, see
        :func:`owner_layers`): keep each parameter's norm too (see ParameterNorms)."""
        columns = self.ensure_layers(layer_names, layer_types, layer_params)
        if self.count == self._capacity:
            self._grow(2 * self._capacity, self._layer_capacity)
        row = self.count
        self.step_numbers[row] = step
        self.loss[row] = loss
        if stats is not None:
            self.total_grad_norm[row] = stats.total_grad_norm
            self.loss_scale[row] = stats.loss_scale or 0.0
            self.skipped[row] = stats.skipped
            self.wall_time[row] = np.nan if stats.wall_time is None else stats.wall_time
            packed = statistic_rows(stats)
            self._stats["grad_norm"][row, columns] = packed[0]
            self._stats["max_abs"][row, columns] = packed[1]
            self._stats["weight_norm"][row, columns] = packed[2]
            if stats.update_ratio is not None:
                self._stats["update_ratio"][row, columns] = _to_float32(stats.update_ratio)
            self._add_figures(row, named_figures(stats), columns, stats.absent)
            self._status[row, columns] = stats.status
            self.worst_status[columns] = np.maximum(self.worst_status[columns], stats.status)
            self._note_onsets(step, layer_names, stats)
            for kind, layer, message in stats.episode_events or ():
                self.events.append(Event(step, kind, layer, message))
            for warning in stats.warnings:
                self.warnings.append(warning)
                self.events.append(Event(step, "warning", warning.module, warning.describe()))
            if param_names is not None and len(stats.param_grad_norm) == len(param_names):
                self._add_parameter_norms(row, [stats], param_names, param_layers)
        self.count += 1
        if origin is not None:
            self.origins.append(origin)
            if self.first_nonfinite is None:
                self.first_nonfinite = origin
            self.events.append(Event(step, "origin", origin.module, origin.describe()))

    def extend(
        self,
        steps: Sequence[tuple[int, float, StepStats | None, Origin | None]],
        layer_names: Sequence[str],
        layer_types: Sequence[str] | None = None,
        layer_params: Sequence[int] | None = None,
        param_names: Sequence[str] | None = None,
        param_layers: Sequence[str] | None = None,
    ) -> None:
        """Append several steps (step, loss, stats, origin) that share one layer layout: the
        same as :meth:`append` for each in turn, with one numpy operation per statistic for
        all of them (the app receives steps in batches; appending them one by one cost the
        GUI thread, and through the GIL the training loop, about 40 µs a step)."""
        if not steps:
            return
        if len(set(layer_names)) < len(layer_names) or any(
            stats is None or origin is not None or stats.episode_events or stats.warnings
            for _, _, stats, origin in steps
        ):
            for step, loss, stats, origin in steps:  # rare: each in turn
                self.append(
                    step,
                    loss,
                    stats,
                    layer_names,
                    layer_types,
                    layer_params,
                    origin,
                    param_names,
                    param_layers,
                )
            return
        columns = self.ensure_layers(layer_names, layer_types, layer_params)
        count = len(steps)
        if self.count + count > self._capacity:
            self._grow(max(self.count + count, 2 * self._capacity), self._layer_capacity)
        rows = slice(self.count, self.count + count)
        all_stats = [stats for _, _, stats, _ in steps]
        self.step_numbers[rows] = [step for step, _, _, _ in steps]
        self.loss[rows] = [loss for _, loss, _, _ in steps]
        self.total_grad_norm[rows] = [stats.total_grad_norm for stats in all_stats]
        self.loss_scale[rows] = [stats.loss_scale or 0.0 for stats in all_stats]
        self.skipped[rows] = [stats.skipped for stats in all_stats]
        self.wall_time[rows] = [
            np.nan if stats.wall_time is None else stats.wall_time for stats in all_stats
        ]
        block = np.stack([statistic_rows(stats) for stats in all_stats])
        for k, name in enumerate(("grad_norm", "max_abs", "weight_norm")):
            self._stats[name][rows, columns] = block[:, k]
        ratios = [stats.update_ratio for stats in all_stats]
        if all(ratio is not None for ratio in ratios):
            self._stats["update_ratio"][rows, columns] = _to_float32(np.stack(ratios))
        else:
            for row, ratio in enumerate(ratios, start=self.count):
                if ratio is not None:
                    self._stats["update_ratio"][row, columns] = _to_float32(ratio)
        for row, stats in enumerate(all_stats, start=self.count):
            self._add_figures(row, named_figures(stats), columns, stats.absent)
        status = np.stack([stats.status for stats in all_stats])
        self._status[rows, columns] = status
        self.worst_status[columns] = np.maximum(self.worst_status[columns], status.max(axis=0))
        for stats in all_stats:
            if stats.tiny_reasons:
                self.tiny_reasons.update(stats.tiny_reasons)
        numbers = [step for step, _, _, _ in steps]
        self.events.extend(self.onsets.steps(numbers, layer_names, all_stats, status))
        if param_names is not None and all(
            len(stats.param_grad_norm) == len(param_names) for stats in all_stats
        ):
            self._add_parameter_norms(self.count, all_stats, param_names, param_layers)
        self.count += count

    def _add_figures(
        self,
        row: int,
        figures: dict[str, np.ndarray],
        columns: np.ndarray,
        absent: dict[str, np.ndarray] | None = None,
    ) -> None:
        for name, values in figures.items():
            if np.shape(values) != columns.shape:  # not one figure per layer: not this step's
                continue
            self.ensure_statistic(name)
            packed = _to_float32(values)
            mask = absent.get(name) if absent else None
            if mask is not None and np.shape(mask) == columns.shape and mask.any():
                packed[mask] = MISSING  # not applicable: a gap, as an unwatched cell
                self.absent_matrix(name, create=True)[row, columns[mask]] = True
            self._stats[name][row, columns] = packed
            self._due[name][row] = True

    def absent_matrix(self, name: str, *, create: bool = False) -> np.ndarray | None:
        """Where named statistic ``name`` was due but did not apply (the full buffer,
        rows x layer capacity); None when it never was absent (nothing is kept for it)."""
        found = self._absent.get(name)
        if found is None and create:
            found = self._absent[name] = np.zeros(
                (self._capacity, self._layer_capacity), dtype=bool
            )
        return found

    def ensure_statistic(self, name: str) -> None:
        """Room for a named statistic (MISSING, and not due, at every step so far)."""
        if name in self._stats:
            return
        self.figure_names.append(name)
        self._stats[name] = np.full(
            (self._capacity, self._layer_capacity), MISSING, dtype=np.float32
        )
        self._due[name] = np.zeros(self._capacity, dtype=bool)

    def describe_statistics(self, infos: Sequence[StatisticInfo]) -> None:
        """What the watch says of its statistics (labels, schedules), by name."""
        for info in infos:
            self.statistic_infos[info.name] = info

    def statistic_info(self, name: str) -> StatisticInfo:
        """What is known of statistic ``name`` (its name alone when nothing described it)."""
        return self.statistic_infos.get(name) or StatisticInfo(name)

    def _add_parameter_norms(
        self,
        first_row: int,
        all_stats: Sequence[StepStats],
        param_names: Sequence[str],
        param_layers: Sequence[str] | None,
    ) -> None:
        norms = self.parameter_norms
        owners = param_layers if param_layers is not None else [""] * len(param_names)
        columns = norms.ensure(param_names, owners)
        rows = np.arange(first_row, first_row + len(all_stats), dtype=np.int64)
        wanted = rows % norms.stride == 0
        if not wanted.any():
            return
        chosen = [stats for stats, keep in zip(all_stats, wanted.tolist(), strict=True) if keep]
        norms.add(rows[wanted], columns, np.stack([s.param_grad_norm for s in chosen]))

    def _note_onsets(self, step: int, names: Sequence[str], stats: StepStats) -> None:
        if stats.tiny_reasons:
            self.tiny_reasons.update(stats.tiny_reasons)
        self.events.extend(
            self.onsets.step(step, names, stats.status, stats.grad_norm, stats.tiny_reasons)
        )

    # -- reading -----------------------------------------------------------------------
    def series(self, statistic: str, layer: str) -> np.ndarray:
        """A view of one layer's values over the recorded steps (MISSING where unwatched)."""
        return self.matrix(statistic)[:, self._column[layer]]

    def matrix(self, statistic: str) -> np.ndarray:
        """A view, steps x layers, of one statistic. A named statistic this history never
        held (another run's, compared with it) is MISSING throughout."""
        values = self._stats.get(statistic)
        if values is None:
            return np.full((self.count, len(self.layer_names)), MISSING, dtype=np.float32)
        return values[: self.count, : len(self.layer_names)]

    def status_matrix(self) -> np.ndarray:
        return self._status[: self.count, : len(self.layer_names)]

    @property
    def statistic_names(self) -> list[str]:
        """Every statistic held: the built-in ones, then the named ones in order first seen."""
        return [*STATISTICS, *self.figure_names]

    def figure_due(self, name: str) -> np.ndarray:
        """Per step, whether named statistic ``name`` was due (measured) at it."""
        return self._due[name][: self.count]

    def figure_measured(self, name: str) -> np.ndarray:
        """Steps x layers: where named statistic ``name`` holds a value (due at the step,
        the layer watched at it, and the statistic applicable to it), whatever the value (a
        negative one too)."""
        watched = self.status_matrix() != STATUS_MISSING
        measured = watched & self.figure_due(name)[:, None]
        absent = self.figure_absent(name)
        if absent is not None:
            measured &= ~absent
        return measured

    def figure_absent(self, name: str) -> np.ndarray | None:
        """Steps x layers: where named statistic ``name`` was due but did not apply to the
        layer (``StepStats.absent``); None when it never was absent."""
        found = self._absent.get(name)
        return None if found is None else found[: self.count, : len(self.layer_names)]

    def row_of_step(self, step: int) -> int | None:
        rows = np.flatnonzero(self.step_numbers[: self.count] == step)
        return int(rows[-1]) if len(rows) else None

    def worst(self, layer: str) -> str:
        """The worst status over the run (statuses are ordered by severity)."""
        return STATUS_NAMES[int(self.worst_status[self._column[layer]])]

    def _measured_statuses(self, layer: str) -> tuple[np.ndarray, np.ndarray]:
        """The steps that measured ``layer`` and its status at each."""
        column = self._status[: self.count, self._column[layer]]
        seen = column != STATUS_MISSING
        return self.step_numbers[: self.count][seen], column[seen]

    def measured(self, layer: str) -> bool:
        """Some step measured the layer (one that none did has no status at all)."""
        return bool(len(self._measured_statuses(layer)[0])) or bool(
            self.worst_status[self._column[layer]]
        )

    def last_status(self, layer: str) -> str | None:
        """The status at the last step that measured the layer; None when none did."""
        _, statuses = self._measured_statuses(layer)
        return STATUS_NAMES[int(statuses[-1])] if len(statuses) else None

    def worst_first_seen(self, layer: str) -> int | None:
        """The step at which the layer's worst status was first seen; None when no kept
        step shows it (no step measured the layer)."""
        steps, statuses = self._measured_statuses(layer)
        found = np.flatnonzero(statuses == self.worst_status[self._column[layer]])
        return int(steps[found[0]]) if len(found) else None

    @property
    def steps(self) -> np.ndarray:
        return self.step_numbers[: self.count]

    @property
    def losses(self) -> np.ndarray:
        return self.loss[: self.count]

    def has_wall_time(self) -> bool:
        """Every step has its wall-clock time (a recording written before GradScope stamped
        steps has none: the plots then offer steps only)."""
        return bool(self.count) and bool(np.isfinite(self.wall_time[: self.count]).all())

    def elapsed_seconds(self) -> np.ndarray:
        """Each step's wall-clock time in seconds since the run's first step (TensorBoard's
        "Relative" axis); NaN without wall-clock times."""
        return _elapsed(self.wall_time[: self.count])

    def rewind_to(self, step: int) -> None:
        """Forget step ``step`` and everything after it: a rewound run's new branch replaces
        them. Events, the first NaN/Inf origin and each layer's worst status are those of the
        steps that remain."""
        keep = int(np.searchsorted(self.step_numbers[: self.count], step, side="left"))
        # The forgotten rows go back to "not measured": the new branch's steps only write
        # the cells they measure (watched layers, an update ratio when there is one).
        for name in self._stats:
            self._stats[name][keep : self.count] = MISSING
        for name in self._due:
            self._due[name][keep : self.count] = False
        for name in self._absent:
            self._absent[name][keep : self.count] = False
        self._status[keep : self.count] = STATUS_MISSING
        self.total_grad_norm[keep : self.count] = 0.0
        self.loss_scale[keep : self.count] = 0.0
        self.skipped[keep : self.count] = False
        self.wall_time[keep : self.count] = np.nan
        self.parameter_norms.forget_from(keep)
        self.count = keep
        # The origin goes with its event: both belong to the step that found it, which for
        # an "update" origin is one step after the origin's own (the optimizer step that
        # wrote the weights); the new branch re-runs that step and finds it again.
        found_at = next((e.step for e in self.events if e.kind == "origin"), None)
        found_steps = [e.step for e in self.events if e.kind == "origin"]
        if len(found_steps) == len(self.origins):  # each origin with the step that found it
            self.origins = [o for o, s in zip(self.origins, found_steps, strict=True) if s < step]
        else:
            self.origins = [o for o in self.origins if o.step < step]
        self.events = [event for event in self.events if event.step < step]
        self.warnings = [warning for warning in self.warnings if warning.step < step]
        if self.first_nonfinite is not None:
            if found_at is None:
                found_at = self.first_nonfinite.step
            if found_at >= step:
                self.first_nonfinite = None
        status = self._status[:keep, : len(self.layer_names)]
        measured = np.where(status == STATUS_MISSING, 0, status)
        worst = measured.max(axis=0) if keep else np.zeros(len(self.layer_names), np.uint8)
        self.worst_status[: len(self.layer_names)] = worst
        self.onsets.forget()
        if keep:
            last = status[keep - 1]
            self.onsets.set(self.layer_names, np.where(last == STATUS_MISSING, STATUS_OK, last))

    def nbytes(self) -> int:
        return (
            sum(a.nbytes for a in self._stats.values())
            + sum(a.nbytes for a in self._due.values())
            + sum(a.nbytes for a in self._absent.values())
            + self._status.nbytes
            + self.parameter_norms.nbytes()
        )
