"""The statistics one watch measures (the built-in ones and the user's, one protocol: see
gradscope.core.watch.statistics), checked when the watch is made, scheduled step by step, and
turned off one by one when they fail."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradscope.core.errors import GradScopeError
from gradscope.core.facts import RESERVED_STATISTIC_NAMES, StatisticInfo
from gradscope.core.user_warnings import warn_user
from gradscope.core.watch.statistics import BUILT_INS, COMBINES, Statistic, StatisticError

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def _checked(statistic: Any, taken: set[str]) -> Statistic:
    """``statistic`` when it is one the watch can measure, else a GradScopeError saying
    what is wrong with it."""
    if isinstance(statistic, type) and issubclass(statistic, Statistic):
        raise GradScopeError(
            f"statistics=: {statistic.__name__} is a class; pass an instance, "
            f"{statistic.__name__}()"
        )
    if not isinstance(statistic, Statistic):
        raise GradScopeError(
            f"statistics=: {statistic!r} is not a gradscope.Statistic (subclass it and "
            "define parameter(self, grad, weight) or output(self, module, output))"
        )
    kind = type(statistic).__name__
    name = statistic.name
    if not isinstance(name, str) or not name.strip():
        raise GradScopeError(f"statistics=: {kind} has no name (set name = '...')")
    if not _NAME.fullmatch(name):
        raise GradScopeError(
            f"statistics=: {kind}.name {name!r}: letters, digits, '_', '-' and '.' only (it "
            "is a column, a JSON key and a tag)"
        )
    if name in taken:
        raise GradScopeError(f"statistics=: two statistics are named {name!r}")
    if name in RESERVED_STATISTIC_NAMES:
        raise GradScopeError(
            f"statistics=: {kind}.name {name!r} is taken by the reports (a layer's "
            f"{name!r} field); choose another name"
        )
    if statistic.combine not in COMBINES:
        raise GradScopeError(
            f"statistics=: {kind}.combine is {statistic.combine!r}; one of "
            + ", ".join(map(repr, COMBINES))
        )
    every = statistic.every
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise GradScopeError(
            f"statistics=: {kind}.every must be an int >= 1 or None, not {every!r}"
        )
    own_parameter = type(statistic).parameter is not Statistic.parameter
    own_batched = type(statistic).fused is not Statistic.fused
    if statistic.source == "output":
        if own_parameter:
            raise GradScopeError(
                f"statistics=: {kind} defines both parameter() and output(); one per statistic"
            )
    elif not (own_parameter or own_batched):
        raise GradScopeError(
            f"statistics=: {kind} defines neither parameter(self, grad, weight) nor "
            "output(self, module, output)"
        )
    return statistic


class StatisticSet:
    """The watch's statistics: the built-in ones and ``extra``, the user's, after them."""

    def __init__(self, extra: Sequence[Any]) -> None:
        chosen = list(BUILT_INS)
        taken = {s.name for s in BUILT_INS}
        for statistic in extra:
            chosen.append(_checked(statistic, taken))
            taken.add(statistic.name)
        self.all: list[Statistic] = chosen
        self.user: list[Statistic] = chosen[len(chosen) - len(extra) :]
        # The statistics whose batched reads may give None (not applicable): the user's;
        # a built-in never does, so its reads skip the look for one.
        self.may_not_apply = frozenset(s.name for s in self.user)
        self.off: set[str] = set()
        # A step's failures, by statistic: settled (warned, turned off) after the step.
        self.failures: dict[Statistic, str] = {}
        # A step's parameters a statistic does not apply to (it gave None), by name: their
        # positions in the watch's parameters, found on the host as the reads are queued.
        self.absent: dict[str, list[np.ndarray]] = {}
        self._refresh()

    def _refresh(self) -> None:
        live = [s for s in self.all if s.name not in self.off]
        self._batched = [s for s in live if not s.read_by_watch and s.source == "parameter"]
        self._outputs = [s for s in live if s.source == "output"]
        self._trouble = tuple(s for s in self._batched if s.on_trouble)
        # What each step reads, by (detail_every, step modulo every schedule's common
        # multiple): a dict lookup per step, not a pass over the statistics.
        self._reads: dict[tuple[int, int], tuple[Statistic, ...]] = {}
        self._periods: dict[int, int] = {}
        self._more: dict[tuple[Statistic, ...], tuple[Statistic, ...]] = {}

    @property
    def has_outputs(self) -> bool:
        return bool(self._outputs)

    def infos(self, detail_every: int, options: Any) -> list[StatisticInfo]:
        """Those measured now: not turned off, and with their watch ``option`` on (read
        from ``options``, the watch, when asked: a runner may switch it)."""
        return [
            s.info(detail_every)
            for s in self.all
            if s.name not in self.off and (s.option is None or getattr(options, s.option, False))
        ]

    @staticmethod
    def _due(statistic: Statistic, step: int, detail_every: int) -> bool:
        own = getattr(statistic, "due", None)  # a forward statistic with its own schedule
        if own is not None:
            return own(step, detail_every)
        every = statistic.every
        return step % (detail_every if every is None else every) == 0

    def parameter_reads(self, step: int, detail_every: int) -> tuple[Statistic, ...]:
        """The batched parameter statistics due at ``step``, in reading order."""
        period = self._periods.get(detail_every)
        if period is None:
            everies = [detail_every if s.every is None else s.every for s in self._batched]
            period = self._periods[detail_every] = math.lcm(1, *everies)
        key = (detail_every, step % period)
        found = self._reads.get(key)
        if found is None:
            found = tuple(s for s in self._batched if self._due(s, step, detail_every))
            self._reads[key] = found
        return found

    def output_reads(self, step: int, detail_every: int) -> tuple[Statistic, ...]:
        return tuple(s for s in self._outputs if self._due(s, step, detail_every))

    def trouble_reads(self, done: tuple[Statistic, ...]) -> tuple[Statistic, ...]:
        """The statistics a step that goes wrong also reads, those it has not read yet."""
        found = self._more.get(done)
        if found is None:
            found = self._more[done] = tuple(s for s in self._trouble if s not in done)
        return found

    def failed(self, statistic: Statistic, error: BaseException) -> None:
        """Note that ``statistic`` failed at this step (the first failure is the one told)."""
        if statistic not in self.failures:
            message = str(error) or type(error).__name__
            if not isinstance(error, StatisticError):
                message = f"raised {type(error).__name__}: {message}"
            self.failures[statistic] = message

    def not_applicable(
        self,
        statistic: Statistic,
        group: Any,
        present: list[int] | None,
        positions: list[int],
    ) -> None:
        """Note that ``statistic`` gave None at this step for the parameters at
        ``positions`` among ``group``'s present ones (``present``: None for all)."""
        indices = group.index_array if present is None else group.index_array[present]
        self.absent.setdefault(statistic.name, []).append(indices[positions])

    def take_absent(self, n_params: int) -> dict[str, np.ndarray]:
        """This step's not-applicable parameters as a bool mask per statistic name (only
        those with some), and forget them."""
        if not self.absent:
            return {}
        masks = {}
        for name, found in self.absent.items():
            mask = np.zeros(n_params, dtype=bool)
            for indices in found:
                mask[indices] = True
            masks[name] = mask
        self.absent.clear()
        return masks

    def settle(self) -> set[str]:
        """Turn off the statistics that failed at this step, one warning each; their names."""
        if not self.failures:
            return set()
        names = set()
        for statistic, message in self.failures.items():
            names.add(statistic.name)
            self.off.add(statistic.name)
            warn_user(
                f"gradscope.watch: statistic {statistic.name!r} ({type(statistic).__name__}) "
                f"{message}; it is turned off, training goes on"
            )
        self.failures.clear()
        self._refresh()
        return names
