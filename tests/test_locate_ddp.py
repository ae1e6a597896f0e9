"""Under DDP, with no locate= and no batch=, the watch repeats the step it captured and
gives the answer that locate= gives: the rank whose batch broke names its input, the other
rank names that rank; nobody hangs (2 processes, gloo on CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from models.distributed_workers import ddp_nan_in_one_rank_captured, start_workers

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)


def test_ddp_without_locate_is_located_as_with_it(tmp_path):
    start_workers(ddp_nan_in_one_rank_captured, tmp_path, 2)
    rank0, rank1 = (json.loads((tmp_path / f"facts{r}.json").read_text()) for r in (0, 1))
    for facts in (rank0, rank1):
        assert [s["step"] for s in facts["steps"] if s["origin"]] == [0, 3]
    for entry in rank0["steps"]:
        if entry["origin"] is not None:  # the NaN came with rank 0's model call
            origin = entry["origin"]
            assert (origin["phase"], origin["tensor"]) == ("input", "inputs"), origin
            assert origin["details"]["source"] == "model call"
    for entry in rank1["steps"]:
        if entry["origin"] is not None:
            assert entry["origin"]["phase"] == "unknown"
            assert "rank 0 had a non-finite batch" in entry["origin"]["details"]["reason"]
