"""benchmarks/overhead.py's distributed case (FSDP2 on 2 gloo processes, CPU) at its smallest:
one round of one step per variant. It checks that the case runs, that the watch's total grad
norm equals clip_grad_norm_'s under FSDP2, and that a failing rank ends it with a message."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)


@pytest.fixture
def overhead(monkeypatch):
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(repo))  # spawned ranks inherit it
    import benchmarks.overhead

    return benchmarks.overhead


def _one_round(case):
    return dataclasses.replace(case, rounds=1, min_rounds=1, steps=1, budget_s=0.0)


def test_fsdp2_case_runs_and_the_watch_total_norm_is_clip_grad_norms(overhead):
    case = next(c for c in overhead.distributed_cases() if c.name == "fsdp2_mlp")
    result = overhead.run_distributed_case(_one_round(case), 1.0)
    assert result["world_size"] == 2 and result["rounds"] == 1
    assert result["watched_layers"] == 20
    sanity = result["sanity"]
    assert sanity["clip_grad_norm_total"] > 0
    assert sanity["max_relative_difference"] <= overhead.SANITY_RELATIVE
    variants = result["variants"]
    assert set(variants) == set(overhead.DIST_VARIANTS)
    assert variants["plain"]["call_ms_median"] < 0.05  # nothing is called between
    for name in ("clip", "gradscope", "gradscope_detail1", "gradscope_clip", "reads_only"):
        assert variants[name]["call_ms_median"] > 0
    assert isinstance(result["meets_target"], bool)


def _build_failing_on_rank1(device):
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 cannot build this model")
    return torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), None


def _no_units(model):
    return []


def test_a_failing_rank_ends_the_case_with_its_message(overhead):
    case = overhead.DistributedCase(
        "broken", "fails on rank 1", _build_failing_on_rank1, _no_units, 1, 1, 0.0, 1
    )
    started = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"(?s)rank 1 failed.*ValueError: rank 1 cannot build this model"
    ):
        overhead.run_distributed_case(case, 1.0)
    assert time.monotonic() - started < 60


def _build_hanging_on_rank1(device):
    if torch.distributed.get_rank() == 1:
        time.sleep(600)
    return torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), None


def test_a_hanging_rank_ends_the_case_with_a_message(overhead, monkeypatch):
    monkeypatch.setattr(overhead, "DIST_JOIN_MARGIN_S", 5.0)  # each rank's deadline
    case = overhead.DistributedCase(
        "hangs", "hangs on rank 1", _build_hanging_on_rank1, _no_units, 1, 1, 0.0, 1
    )
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)rank \d failed.*after 5 s dumps every thread"):
        overhead.run_distributed_case(case, 1.0)
    assert time.monotonic() - started < 60
