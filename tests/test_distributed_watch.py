"""The watch under real torch.distributed: 2 processes, gloo on CPU, 127.0.0.1, bounded in
time (a hang fails with every worker's stacks)."""

from __future__ import annotations

import json

import pytest
import torch
from models.distributed_workers import (
    ddp_nan_in_one_rank,
    fsdp1_statistics,
    fsdp1_user_statistics,
    fsdp2_on_cuda,
    fsdp2_statistics,
    fsdp2_user_statistics,
    hsdp_statistics,
    start_workers,
)

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)


def run_workers(function, tmp_path, world: int = 2) -> list[dict]:
    start_workers(function, tmp_path, world)
    return [json.loads((tmp_path / f"facts{rank}.json").read_text()) for rank in range(world)]


def test_ddp_nan_in_one_rank_is_located_there_and_nobody_hangs(tmp_path):
    rank0, rank1 = run_workers(ddp_nan_in_one_rank, tmp_path)
    for facts in (rank0, rank1):
        assert facts["layers"] == ["0", "1", "3"]  # the model's names, no "module." prefix
        # The gradient all-reduce spreads the NaN: both ranks see steps 0 and 3 non-finite.
        assert [s["step"] for s in facts["steps"] if s["nonfinite"]] == [0, 3]
        assert [s["step"] for s in facts["steps"] if s["origin"]] == [0, 3]
    for entry in rank0["steps"]:
        if entry["origin"] is not None:  # the rank whose batch broke: located
            assert entry["origin"]["phase"] != "unknown", entry["origin"]
    for entry in rank1["steps"]:
        if entry["origin"] is not None:  # the other rank: says which rank to look at
            assert entry["origin"]["phase"] == "unknown"
            assert "rank 0 had a non-finite batch" in entry["origin"]["details"]["reason"]
    for facts in (rank0, rank1):  # every rank knows which rank broke, at every step
        for entry in facts["steps"]:
            assert entry["broken"] == ([0] if entry["step"] in (0, 3) else [])
    assert rank0["steps"][0]["origin"]["phase"] == "input"  # the NaN was in its batch
    assert rank0["steps"][0]["origin"]["tensor"] == "inputs"
    assert rank0["path"].endswith("run.rank0.gsrec") and rank1["path"].endswith("run.rank1.gsrec")
    from gradscope.core.recording import RecordingReader

    for rank in (0, 1):
        with RecordingReader(tmp_path / f"run.rank{rank}.gsrec") as reader:
            assert reader.load()[1].count == 6


def check_sharded_run(facts: dict) -> None:
    """Every step's statistics equal the unsharded reference's (detail where the watch read
    it), NaN counts too, each with one all_gather per collect() on a plain step."""
    assert facts["names"]["early"] == facts["expected_names"]
    assert facts["names"]["late"] == facts["expected_names"]
    for step, entry in enumerate(facts["steps"]):
        if step != 3:  # the NaN step's totals are NaN
            total = entry["expected_total"]
            assert abs(entry["subset_total"] - total) < 1e-5 * total, (step, entry)
        for label in ("early", "late"):
            got = entry[label]
            assert got["status"] == got["expected_status"], (step, label, got)
            assert got["nan"] == got["expected_nan"], (step, label, got)
            if got["expected_nan"] == [0] * len(got["nan"]):
                assert got["grad_norm"] < 1e-5, (step, label, got)
                assert got["total"] < 1e-4, (step, label, got)
                for key in ("max_abs", "weight_norm"):
                    assert got[key] is None or got[key] < 1e-5, (step, label, key, got)
        # detail_every=1: every step has the detail; the default watch on its first step
        assert entry["early"]["max_abs"] is not None
        if step == 0:
            assert entry["late"]["max_abs"] is not None
        if step == 2:  # a step like the one before it: norms only, one collective
            assert entry["late"]["max_abs"] is None
            assert entry["late_collectives"] == {
                "all_gather_single": 1,
                "all_gather_into_tensor": 0,
                "all_reduce": 0,
                "all_gather": 0,
                "broadcast": 0,
            }
    assert facts["steps"][3]["broken"] == [0]
    # The update ratio equals the reference's on the steps that read it (the first, and
    # status changes), none on the NaN step (no optimizer step)
    assert facts["ratios"][0] is not None
    assert all(r is None or r < 1e-5 for r in facts["ratios"]), facts["ratios"]
    assert facts["ratios"][3] is None
    first, skipped, last = facts["skipped_rank_ratio"]
    assert first is not None and max(first) > 0
    assert skipped is None and last is None


def check_own_shards(facts_per_rank: list[dict], replicas: int) -> None:
    """collectives=False: each rank's figures are its own shards', so their squares add up
    to the whole model's, each shard counted once (HSDP: every replica holds it)."""
    first = facts_per_rank[0]["steps"][0]
    own = [facts["steps"][0]["own_total"] for facts in facts_per_rank]
    assert min(own) > 0
    whole = sum(total**2 for total in own) / replicas
    assert abs(whole - first["expected_total"] ** 2) < 1e-4 * first["expected_total"] ** 2


def test_fsdp1_with_orig_params_equals_an_unsharded_copy(tmp_path):
    every = run_workers(fsdp1_statistics, tmp_path)
    check_own_shards(every, replicas=1)
    for facts in every:
        check_sharded_run(facts)
        more = facts["more"]
        # Wrapped whole after the watch: right figures, and a warning that says why the
        # wrapper is out of reach. Without use_orig_params: one layer per unit, whole sizes.
        assert more["early"] < 1e-5
        assert more["units_total"] < 1e-5
        assert more["units"] == ["", "0", "2", "4"]
        assert more["unit_sizes"] == [10, 49, 40, 6]
        inside = more["no_sync"]
        assert inside["warned"] and inside["status"]
        assert inside["grad_norm"] < 1e-5 and inside["max_abs"] < 1e-6
        said = " ".join(more["warnings"])
        assert "before FSDP wrapped it whole" in said
        assert "use_orig_params=True" in said


def test_hsdp_replicated_shards_are_counted_once(tmp_path):
    every = run_workers(hsdp_statistics, tmp_path)
    check_own_shards(every, replicas=2)
    for facts in every:
        check_sharded_run(facts)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs 2 GPUs (NCCL runs one rank per GPU)",
)
def test_fsdp2_over_nccl_equals_an_unsharded_copy_without_host_syncs(tmp_path):
    for facts in run_workers(fsdp2_on_cuda, tmp_path):
        assert facts["sync_error"] is None, facts["sync_error"]
        for key in ("grad_norm", "max_abs", "weight_norm"):
            assert facts[key] < 1e-5, (key, facts)


def test_fsdp2_statistics_equal_an_unsharded_copy_with_one_collective(tmp_path):
    every = run_workers(fsdp2_statistics, tmp_path)
    check_own_shards(every, replicas=1)
    for facts in every:
        check_sharded_run(facts)
        origin = facts["more"]["fsdp_origin"]
        assert origin["phase"] == "unknown" and "FSDP" in origin["details"]["reason"]


@pytest.mark.parametrize("flavour", ["fsdp2", "fsdp1"])
def test_user_statistics_reduce_over_ranks_as_their_combine_says(tmp_path, flavour):
    """sum, max and rss reduced over the shards equal the unsharded reference's; a "mean"
    is reduced as a sum and a count (issue #36). FSDP1's parts are flat views: a figure of
    the shape (weight_dims) is then the flat part's, by design."""
    worker = fsdp2_user_statistics if flavour == "fsdp2" else fsdp1_user_statistics
    for facts in run_workers(worker, tmp_path):
        for step, differences in enumerate(facts["steps"]):
            for name in ("grad_sum", "grad_max", "grad_l2"):
                assert differences[name] < 1e-5, (step, name, differences)
            if step % 2:
                assert differences["weight_dims"] is None, (step, differences)
            elif flavour == "fsdp2":
                assert differences["weight_dims"] < 1e-9, (step, differences)
