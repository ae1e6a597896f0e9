"""The watch under real torch.distributed: 2 processes, gloo on CPU, 127.0.0.1, bounded in
time (a hang fails with every worker's stacks)."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp
from models.distributed_workers import WORKER_SECONDS, ddp_nan_in_one_rank

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_workers(function, tmp_path, world: int = 2) -> list[dict]:
    context = mp.start_processes(
        function,
        args=(world, free_port(), str(tmp_path)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    # Each worker exits by itself (with its stacks on stderr) past WORKER_SECONDS.
    while not context.join(timeout=WORKER_SECONDS + 30):
        pass
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
        if entry["origin"] is not None:  # the other rank: says where to look
            assert entry["origin"]["phase"] == "unknown"
            assert "another rank" in entry["origin"]["details"]["reason"]
    assert rank0["path"].endswith("run.rank0.gsrec") and rank1["path"].endswith("run.rank1.gsrec")
    from gradscope.core.recording import RecordingReader

    for rank in (0, 1):
        with RecordingReader(tmp_path / f"run.rank{rank}.gsrec") as reader:
            assert reader.load()[1].count == 6
