"""What each rank of a distributed run saw, and which rank broke first.

One shape for both routes that have several ranks: ``gradscope run --nproc N`` (each rank's
steps, streamed by its process) and a set of per-rank recordings (``gradscope report
runs/x.rank1.gsrec``). Under DDP the gradient all-reduce spreads one rank's NaN to every
rank's statistics in the same step, so "which rank broke" is read from what each rank saw of
its *own* step: a non-finite batch, an origin its diagnosis re-run located (forward, loss,
backward), or a non-finite loss. A rank that only saw the NaN in its statistics got it from
another rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gradscope.core.facts import Origin

# What a rank saw of its own step, most upstream first: a NaN/Inf in its batch explains one
# in its forward, which explains one in its loss and then in its gradients.
OWN_CAUSES = ("batch", "forward", "loss", "backward", "update")
# Non-finite only in the statistics: under DDP/FSDP, most likely another rank's gradients.
SEEN_IN_GRADIENTS = "gradients"


@dataclass
class RankFacts:
    """One rank's steps: ``losses`` line up with ``steps`` (None: not given);
    ``nonfinite`` maps each non-finite step to its cause (one of :data:`OWN_CAUSES`, or
    ``"gradients"``); ``origin`` is the rank's first origin; ``state`` is "finished",
    "failed", "stopped" (ended by the launcher after another rank failed) or "timed out";
    ``error`` what stopped it (the report's ``"error"`` shape)."""

    rank: int
    steps: list[int] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    nonfinite: dict[int, str] = field(default_factory=dict)
    origin: Origin | None = None
    state: str = "finished"
    error: dict[str, Any] | None = None
    path: str | None = None  # the rank's recording, for a recording set

    def note_step(
        self,
        step: int,
        loss: float | None,
        *,
        statistics_nonfinite: bool,
        batch_nonfinite: bool = False,
        origin: Origin | None = None,
    ) -> None:
        """Add one step; ``statistics_nonfinite``: the rank's watch saw a NaN/Inf."""
        self.steps.append(int(step))
        self.losses.append(None if loss is None else float(loss))
        if origin is not None and self.origin is None:
            self.origin = origin
        loss_bad = loss is not None and not math.isfinite(loss)
        located = origin is not None and origin.phase in OWN_CAUSES
        if batch_nonfinite:
            self.nonfinite[step] = "batch"
        elif located:
            assert origin is not None
            self.nonfinite[step] = origin.phase
        elif loss_bad:
            self.nonfinite[step] = "loss"
        elif statistics_nonfinite:
            self.nonfinite[step] = SEEN_IN_GRADIENTS

    @property
    def first_nonfinite(self) -> tuple[int, str] | None:
        if not self.nonfinite:
            return None
        step = min(self.nonfinite)
        return step, self.nonfinite[step]

    def to_json(self) -> dict[str, Any]:
        from gradscope.core.report import json_number

        first = self.first_nonfinite
        entry: dict[str, Any] = {
            "rank": self.rank,
            "state": self.state,
            "steps": list(self.steps),
            "loss": [None if v is None else json_number(v) for v in self.losses],
            "nonfinite_steps": sorted(self.nonfinite),
            "first_nonfinite": None if first is None else {"step": first[0], "cause": first[1]},
            "error": self.error,
        }
        if self.path is not None:
            entry["recording"] = self.path
        return entry


def first_nonfinite_rank(ranks: Sequence[RankFacts]) -> int | None:
    """The rank whose own step broke first: the earliest non-finite step of any rank, and
    at that step the rank with its own cause (its batch, a located origin, its loss; the
    most upstream cause wins, then the lowest rank). When no rank saw a cause of its own
    there, the one rank that saw the NaN/Inf at all, else None (all ranks at once: cannot
    tell)."""
    firsts = [(facts, facts.first_nonfinite) for facts in ranks]
    seen = [(facts, first) for facts, first in firsts if first is not None]
    if not seen:
        return None
    step = min(first[0] for _, first in seen)
    at_step = [(facts, first[1]) for facts, first in seen if first[0] == step]
    own = [(OWN_CAUSES.index(cause), facts.rank) for facts, cause in at_step if cause in OWN_CAUSES]
    if own:
        return min(own)[1]
    return at_step[0][0].rank if len(at_step) == 1 else None


def located_origin(ranks: Sequence[RankFacts]) -> tuple[int, Origin] | None:
    """The origin to show for the run: the earliest step's, preferring one that a rank's
    re-run located (the others say "unknown: another rank"), then the lowest rank."""
    found = [
        (facts.origin.step, facts.origin.phase == "unknown", facts.rank, facts.origin)
        for facts in ranks
        if facts.origin is not None
    ]
    if not found:
        return None
    _, _, rank, origin = min(found, key=lambda item: item[:3])
    return rank, origin


def ranks_json(ranks: Sequence[RankFacts]) -> dict[str, Any]:
    """The report's per-rank fields: ``"ranks"`` and ``"first_nonfinite_rank"``."""
    return {
        "ranks": [facts.to_json() for facts in ranks],
        "first_nonfinite_rank": first_nonfinite_rank(ranks),
    }


def rank_lines(ranks: Sequence[RankFacts]) -> list[str]:
    """The console's per-rank lines: losses first -> last, the first non-finite step and
    its cause, and how each rank ended."""
    lines = []
    for facts in ranks:
        given = [v for v in facts.losses if v is not None]
        text = f"rank {facts.rank}: {len(facts.steps)} step(s)"
        if given:
            text += f", loss {given[0]:.4g} -> {given[-1]:.4g}"
        first = facts.first_nonfinite
        if first is not None:
            step, cause = first
            text += f", first non-finite at step {step} ({_cause_words(cause)})"
        if facts.state != "finished":
            text += f"; {facts.state}"
        lines.append(text)
    broke = first_nonfinite_rank(ranks)
    if broke is not None:
        text = f"first rank to go non-finite: rank {broke}"
        together = _own_at_first_step(ranks)
        if len(together) > 1:
            text += f" (ranks {', '.join(map(str, together))} each broke in the same step)"
        lines.append(text)
    elif any(facts.nonfinite for facts in ranks):
        lines.append("first rank to go non-finite: cannot tell (every rank at once)")
    return lines


def _own_at_first_step(ranks: Sequence[RankFacts]) -> list[int]:
    """The ranks whose own step broke at the run's first non-finite step."""
    firsts = [(facts.rank, facts.first_nonfinite) for facts in ranks]
    seen = [(rank, first) for rank, first in firsts if first is not None]
    if not seen:
        return []
    step = min(first[0] for _, first in seen)
    return [rank for rank, first in seen if first[0] == step and first[1] in OWN_CAUSES]


def _cause_words(cause: str) -> str:
    if cause == "batch":
        return "its batch"
    if cause == SEEN_IN_GRADIENTS:
        return "in the gradients only"
    if cause == "loss":
        return "its loss"
    return f"its {cause}"
