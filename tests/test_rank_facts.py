"""Which rank broke first, from what each rank saw of its own steps (no processes)."""

from __future__ import annotations

from gradscope.core.origin import Origin
from gradscope.core.rank_facts import (
    RankFacts,
    first_nonfinite_rank,
    located_origin,
    rank_lines,
    ranks_json,
)


def _origin(step: int, phase: str) -> Origin:
    return Origin(step=step, phase=phase, module="0", tensor="output", kind="nan")


def _ranks(*steps_per_rank):
    ranks = []
    for rank, steps in enumerate(steps_per_rank):
        facts = RankFacts(rank)
        for step, kwargs in enumerate(steps):
            facts.note_step(step, kwargs.pop("loss", 1.0), **kwargs)
        ranks.append(facts)
    return ranks


OK = {"statistics_nonfinite": False}
SPREAD = {"statistics_nonfinite": True}  # non-finite only in the all-reduced gradients


def test_the_rank_whose_own_batch_broke_is_named_not_the_lowest():
    ranks = _ranks(
        [OK, SPREAD],
        [OK, {"statistics_nonfinite": True, "batch_nonfinite": True, "loss": float("nan")}],
    )
    assert first_nonfinite_rank(ranks) == 1
    assert ranks[1].first_nonfinite == (1, "batch") and ranks[0].first_nonfinite == (1, "gradients")
    assert ranks_json(ranks)["ranks"][1]["loss"] == [1.0, "nan"]
    assert "first rank to go non-finite: rank 1" in rank_lines(ranks)


def test_an_earlier_step_wins_and_upstream_causes_win_in_a_step():
    loss_only = {"statistics_nonfinite": True, "loss": float("inf")}
    forward = {"statistics_nonfinite": True, "origin": _origin(1, "forward")}
    assert first_nonfinite_rank(_ranks([OK, loss_only], [OK, forward])) == 1
    assert first_nonfinite_rank(_ranks([OK, OK, loss_only], [OK, forward])) == 1
    assert first_nonfinite_rank(_ranks([loss_only], [OK, forward])) == 0


def test_every_rank_at_once_with_no_cause_of_its_own_cannot_be_told():
    ranks = _ranks([OK, SPREAD], [OK, SPREAD])
    assert first_nonfinite_rank(ranks) is None
    assert rank_lines(ranks)[-1] == "first rank to go non-finite: cannot tell (every rank at once)"
    assert first_nonfinite_rank(_ranks([OK, OK], [OK, SPREAD])) == 1
    assert first_nonfinite_rank(_ranks([OK], [OK])) is None


def test_the_located_origin_is_preferred_over_another_ranks_unknown_one():
    unknown = {"statistics_nonfinite": True, "origin": _origin(1, "unknown")}
    located = {"statistics_nonfinite": True, "origin": _origin(1, "backward")}
    rank, origin = located_origin(_ranks([OK, unknown], [OK, located]))
    assert (rank, origin.phase) == (1, "backward")
    assert located_origin(_ranks([OK], [OK])) is None
