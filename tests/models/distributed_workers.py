"""Worker processes for the 2-process torch.distributed tests (gloo on CPU, 127.0.0.1).

Each worker dumps every thread's stack and exits if it runs past its time limit, so a hang
fails the test with stacks instead of stalling the suite.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import socket
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from gradscope.core.distributed.worker import leave

WORKER_SECONDS = 90


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_workers(function, folder, world: int = 2) -> None:
    """Run ``function(rank, world, port, str(folder))`` in ``world`` spawned processes and
    wait for them; each exits by itself (with its stacks on stderr) past WORKER_SECONDS."""
    import torch.multiprocessing as mp

    context = mp.start_processes(
        function,
        args=(world, free_port(), str(folder)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    while not context.join(timeout=WORKER_SECONDS + 30):
        pass


def init(rank: int, world: int, port: int) -> None:
    faulthandler.dump_traceback_later(WORKER_SECONDS, exit=True, file=sys.stderr)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )


def finish() -> None:
    """Ends a rank whose facts are written: it meets the others, then leaves without Python's
    shutdown (see ``leave``: a gloo thread can abort the rank as the interpreter finalizes)."""
    dist.barrier()
    dist.destroy_process_group()
    leave(0)


def ddp_nan_loop(
    rank: int,
    model: nn.Module,
    out: str,
    *,
    steps: int,
    batch: int,
    nan_rank: int,
    nan_steps: tuple[int, ...],
    seed_step: int,
    nan_at: tuple[int, int],
    locate: bool = True,
):
    """The DDP loop both NaN-in-one-rank workers run: the model wrapped in DDP, a watch that
    records to ``out/run.gsrec``; rank ``nan_rank``'s batch holds a NaN at ``nan_steps``;
    every rank collects with locate= and batch= (``locate=False``: with neither, the watch
    repeats the step it captured), and skips the optimizer on non-finite steps. Yields
    (watch, stats) for each step; the watch is closed after the last."""
    import gradscope

    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    watch = gradscope.watch(ddp, record=Path(out) / "run.gsrec")
    features = model[0].in_features
    for step in range(steps):
        generator = torch.Generator().manual_seed(seed_step * step + rank)
        x = torch.randn(batch, features, generator=generator)
        y = torch.randn(batch, 1, generator=generator)
        if rank == nan_rank and step in nan_steps:
            x[nan_at] = float("nan")

        def compute_loss(x=x, y=y):
            return nn.functional.mse_loss(ddp(x), y)

        optimizer.zero_grad()
        loss = compute_loss()
        loss.backward()
        if locate:
            stats = watch.collect(loss, locate=compute_loss, batch=(x, y))
        else:
            stats = watch.collect(loss)
        if not stats.nonfinite:
            optimizer.step()
        yield watch, stats
    watch.close()


def ddp_nan_in_one_rank_captured(rank: int, world: int, port: int, out: str) -> None:
    """:func:`ddp_nan_in_one_rank` with no locate= and no batch=."""
    ddp_nan_in_one_rank(rank, world, port, out, locate=False)


def ddp_nan_in_one_rank(rank: int, world: int, port: int, out: str, locate: bool = True) -> None:
    """DDP with BatchNorm; rank 0's batch holds a NaN at steps 0 and 3. Every rank collects
    with locate= and records; the loop skips the optimizer on non-finite steps."""
    init(rank, world, port)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
    facts = {"steps": []}
    loop = ddp_nan_loop(
        rank,
        model,
        out,
        steps=6,
        batch=8,
        nan_rank=0,
        nan_steps=(0, 3),
        seed_step=100,
        nan_at=(2, 1),
        locate=locate,
    )
    for watch, stats in loop:
        facts["layers"] = [layer.name for layer in watch.layers]
        origin = stats.origin
        facts["steps"].append(
            {
                "step": stats.step,
                "nonfinite": stats.nonfinite,
                "origin": None if origin is None else origin.to_dict(),
                "broken": stats.ranks.broken,
            }
        )
    facts["path"] = str(watch.path)
    Path(out, f"facts{rank}.json").write_text(json.dumps(facts, default=str))
    finish()


def fsdp2_statistics(rank: int, world: int, port: int, out: str) -> None:
    """FSDP2 (fully_shard per layer, then the root) with uneven shards (7 and 5 rows over 2
    ranks), through :func:`sharded_run`; then a NaN step that the watch must not re-run (its
    forward would gather parameters from every rank)."""
    from torch.distributed.fsdp import fully_shard

    init(rank, world, port)

    def wrap(model):
        for module in model:
            if next(module.parameters(), None) is not None:
                fully_shard(module)
        fully_shard(model)
        return model

    def not_re_run(reference, model) -> dict:
        import gradscope

        watch = gradscope.watch(model)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
        x[0, 0] = float("nan")
        y = torch.zeros(4, 1)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        stats = watch.collect(loss, locate=lambda: nn.functional.mse_loss(model(x), y))
        return {"fsdp_origin": None if stats.origin is None else stats.origin.to_dict()}

    sharded_run(rank, world, out, wrap, more=not_re_run)


def _compare(got, expected, keys=("grad_norm", "max_abs", "weight_norm")) -> dict:
    """Relative differences of a sharded watch's statistics from an unsharded reference's;
    None where the sharded step had no detail (the reference always has)."""
    out = {}
    for key in keys:
        value = getattr(got, key)
        if value is None:
            out[key] = None
            continue
        reference = getattr(expected, key)
        out[key] = float(np.abs(value - reference).max() / max(np.abs(reference).max(), 1e-12))
    out["total"] = abs(got.total_grad_norm - expected.total_grad_norm)
    out["nan"] = got.nan_count.tolist()
    out["expected_nan"] = expected.nan_count.tolist()
    out["status"] = got.status.tolist()
    out["expected_status"] = expected.status.tolist()
    return out


def _counting(counts: dict, originals: dict):
    def wrap(name):
        def call(*args, **kwargs):
            counts[name] += 1
            return originals[name](*args, **kwargs)

        return call

    return {name: wrap(name) for name in counts}


def sharded_run(rank, world, out, wrap, *, nan_step=3, steps=4, more=None) -> None:
    """Trains an unsharded reference on the concatenated batch beside two sharded copies
    (``wrap`` shards a model in place and returns what to call): one watched before it was
    wrapped (detail every step), one after (the default detail_every, so most steps read
    the norms alone). At ``nan_step`` rank 0's batch holds a NaN. Writes per step the
    differences from the reference and the collectives of the late watch's collect()."""
    import copy

    import gradscope

    torch.manual_seed(0)
    reference = nn.Sequential(
        nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 5), nn.LayerNorm(5), nn.Linear(5, 1)
    )
    before = copy.deepcopy(reference)
    early = gradscope.watch(before, detail_every=1)
    early_model = wrap(before)
    late_model = wrap(copy.deepcopy(reference))
    optimizers = [
        torch.optim.SGD(m.parameters(), lr=0.1) for m in (early_model, late_model, reference)
    ]
    # The update ratio's sums travel with the next step's exchange (none in the hook).
    late = gradscope.watch(late_model, update_ratio=True, optimizer=optimizers[1])
    reference_watch = gradscope.watch(
        reference, collectives=False, detail_every=1, update_ratio=True, optimizer=optimizers[2]
    )
    ratios = []
    # Made on every rank but told to run no collective: this rank's shards only.
    alone = gradscope.watch(late_model, collectives=False)
    # One layer watched: the others' sharded gradients still count in the total norm.
    subset = gradscope.watch(late_model, layers=["0"])
    counts = {
        "all_gather_single": 0,
        "all_gather_into_tensor": 0,
        "all_reduce": 0,
        "all_gather": 0,
        "broadcast": 0,
    }
    originals = {name: getattr(dist, name) for name in counts}
    facts = {"steps": [], "expected_names": [layer.name for layer in reference_watch.layers]}
    facts["names"] = {
        "early": [layer.name for layer in early.layers],
        "late": [layer.name for layer in late.layers],
    }
    for step in range(steps):
        batches = []
        for r in range(world):
            generator = torch.Generator().manual_seed(1000 * step + r)
            x = torch.randn(4, 6, generator=generator)
            if step == nan_step and r == 0:
                x[1, 2] = float("nan")
            batches.append((x, torch.randn(4, 1, generator=generator)))
        x, y = batches[rank]
        for optimizer in optimizers:
            optimizer.zero_grad()
        losses = []
        for model in (early_model, late_model):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            losses.append(loss)
        full_x = torch.cat([b[0] for b in batches])
        full_y = torch.cat([b[1] for b in batches])
        nn.functional.mse_loss(reference(full_x), full_y).backward()
        expected = reference_watch.collect()
        got_early = early.collect(losses[0], batch=(x, y))
        before_counts = dict(counts)
        for name, function in _counting(counts, originals).items():
            setattr(dist, name, function)
        try:
            got_late = late.collect(losses[1], batch=(x, y))
        finally:
            for name, function in originals.items():
                setattr(dist, name, function)
        own = alone.collect()
        partial = subset.collect()
        facts["steps"].append(
            {
                "subset_total": partial.total_grad_norm,
                "own_total": own.total_grad_norm,
                "expected_total": expected.total_grad_norm,
                "early": _compare(got_early, expected),
                "late": _compare(got_late, expected),
                "late_collectives": {k: counts[k] - before_counts[k] for k in counts},
                "broken": got_late.ranks.broken,
            }
        )
        if step != nan_step:
            for optimizer in optimizers:
                optimizer.step()
        ratios.append((got_late, expected))
    facts["ratios"] = [
        None
        if got.update_ratio is None
        else float(np.abs(got.update_ratio - expected.update_ratio).max())
        for got, expected in ratios
    ]
    facts["skipped_rank_ratio"] = _update_when_a_rank_skips(rank, late_model, optimizers[1])
    if more is not None:
        facts["more"] = more(reference, late_model)
    Path(out, f"facts{rank}.json").write_text(json.dumps(facts))
    finish()


def _update_when_a_rank_skips(rank, model, optimizer) -> list:
    """Two detail steps: every rank steps after the first, rank 1 skips after the second
    (as a loss scaler may on one rank). The first gets its update ratio at the second's
    collect(); the second none at the third's, and nobody waits."""
    import gradscope

    watch = gradscope.watch(model, detail_every=1, update_ratio=True, optimizer=optimizer)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(9))
    got = []
    for step in range(3):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), torch.zeros(4, 1)).backward()
        got.append(watch.collect())
        if step == 0 or (step == 1 and rank == 0):
            optimizer.step()
    watch.close()
    return [None if stats.update_ratio is None else stats.update_ratio.tolist() for stats in got]


def fsdp1_statistics(rank: int, world: int, port: int, out: str) -> None:
    """FSDP1 (FullyShardedDataParallel, use_orig_params=True) with a unit per Linear and
    uneven shards: each parameter is a flat view of some of its elements, none on some
    ranks (whose gradient is then None)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    init(rank, world, port)

    def wrap(model):
        return FullyShardedDataParallel(
            model,
            use_orig_params=True,
            device_id=torch.device("cpu"),
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        )

    def whole_units(reference, _model) -> dict:
        """FSDP1 wrapping the model whole after a watch was made on it (the wrapper is out
        of the watch's reach), and use_orig_params=False (one flat parameter per unit)."""
        import copy
        import warnings

        import gradscope

        unsharded = gradscope.watch(reference, collectives=False)
        inner = copy.deepcopy(reference)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            early = gradscope.watch(inner)
            whole = FullyShardedDataParallel(
                inner, use_orig_params=True, device_id=torch.device("cpu")
            )
            flat = FullyShardedDataParallel(
                copy.deepcopy(reference),
                use_orig_params=False,
                device_id=torch.device("cpu"),
                auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
            )
            units = gradscope.watch(flat)
            # The same batch on every rank: FSDP's averaged gradient is the reference's.
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
            for model in (whole, flat, reference):
                model.zero_grad()
                nn.functional.mse_loss(model(x), torch.zeros(4, 1)).backward()
            got_early, got_units = early.collect(), units.collect()
        expected = unsharded.collect()
        return {
            "warnings": [str(w.message) for w in caught if "gradscope" in str(w.message)],
            "early": float(np.abs(got_early.grad_norm - expected.grad_norm).max()),
            "units": [layer.name for layer in units.layers],
            "unit_sizes": [layer.num_params for layer in units.layers],
            "units_total": abs(got_units.total_grad_norm - expected.total_grad_norm),
            "no_sync": _inside_no_sync(rank, reference, wrap),
        }

    sharded_run(rank, world, out, wrap, more=whole_units)


def _inside_no_sync(rank, reference, wrap) -> dict:
    """collect() after a backward inside FSDP1's no_sync() (gradient accumulation): each
    rank's gradients are its own, whole and unreduced; the watch says so and gives this
    rank's figures (those of an unsharded copy on this rank's batch), running no collective
    that the ranks could disagree on; after the synced backward, the model's again."""
    import copy
    import warnings

    import gradscope

    model = wrap(copy.deepcopy(reference))
    alone = copy.deepcopy(reference)
    own = gradscope.watch(alone, collectives=False, detail_every=1)
    watch = gradscope.watch(model, detail_every=1)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(20 + rank))
    y = torch.zeros(4, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with model.no_sync():
            nn.functional.mse_loss(model(x), y).backward()
            got = watch.collect()
    nn.functional.mse_loss(alone(x), y).backward()
    expected = own.collect()
    return {
        "warned": any("no_sync()" in str(w.message) for w in caught),
        "grad_norm": float(np.abs(got.grad_norm - expected.grad_norm).max()),
        "max_abs": float(np.abs(got.max_abs - expected.max_abs).max()),
        "status": got.status.tolist() == expected.status.tolist(),
    }


def hsdp_statistics(rank: int, world: int, port: int, out: str) -> None:
    """FSDP2 on a 2-D mesh that replicates over the 2 ranks (HSDP with one shard each):
    each rank holds the whole tensor, so a sum over ranks must count it once."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    init(rank, world, port)
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))

    def wrap(model):
        for module in model:
            if next(module.parameters(), None) is not None:
                fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    sharded_run(rank, world, out, wrap)


def fsdp2_on_cuda(rank: int, world: int, port: int, out: str) -> None:
    """FSDP2 over NCCL, one GPU per rank: the statistics equal an unsharded copy's, and
    collect() makes no host synchronisation but its one transfer (sync debug mode "error")."""
    from torch.distributed.fsdp import fully_shard

    import gradscope

    faulthandler.dump_traceback_later(WORKER_SECONDS, exit=True, file=sys.stderr)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    device = torch.device("cuda", rank)
    torch.manual_seed(0)
    reference = nn.Sequential(
        nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 5), nn.LayerNorm(5), nn.Linear(5, 1)
    ).to(device)
    import copy

    sharded = copy.deepcopy(reference)
    for module in sharded:
        if next(module.parameters(), None) is not None:
            fully_shard(module)
    fully_shard(sharded)
    watch = gradscope.watch(sharded, detail_every=1)
    reference_watch = gradscope.watch(reference, collectives=False, detail_every=1)
    generator = torch.Generator().manual_seed(7)
    batches = [
        (torch.randn(4, 6, generator=generator), torch.randn(4, 1, generator=generator))
        for _ in range(world)
    ]
    x, y = (t.to(device) for t in batches[rank])
    nn.functional.mse_loss(sharded(x), y).backward()
    full_x = torch.cat([b[0] for b in batches]).to(device)
    full_y = torch.cat([b[1] for b in batches]).to(device)
    nn.functional.mse_loss(reference(full_x), full_y).backward()
    expected = reference_watch.collect()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = watch.collect()
        sync_error = None
    except RuntimeError as error:
        sync_error = str(error)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    facts = {"sync_error": sync_error}
    if sync_error is None:
        facts.update(_compare(got, expected))
    Path(out, f"facts{rank}.json").write_text(json.dumps(facts))
    finish()


def _user_statistics() -> list:
    """A user's statistics of each combine that reduces over ranks (issue #36)."""
    import gradscope

    class GradSum(gradscope.Statistic):
        name = "grad_sum"
        combine = "sum"
        every = 1

        def parameter(self, grad, weight):
            return grad.sum()

    class GradMax(gradscope.Statistic):
        name = "grad_max"
        combine = "max"
        every = 1

        def parameter(self, grad, weight):
            return grad.abs().amax()

    class GradNorm2(gradscope.Statistic):
        name = "grad_l2"
        combine = "rss"
        every = 1

        def parameter(self, grad, weight):
            return torch.linalg.vector_norm(grad)

    class WeightDims(gradscope.Statistic):
        # The same on every part of a parameter: a "mean" over parts and parameters is then
        # the sharded watch's and the reference's alike (2 for a weight, 1 for a bias).
        name = "weight_dims"
        combine = "mean"
        every = 2

        def parameter(self, grad, weight):
            return weight.new_full((), float(weight.dim()))

    return [GradSum(), GradMax(), GradNorm2(), WeightDims()]


def fsdp1_user_statistics(rank: int, world: int, port: int, out: str) -> None:
    """:func:`fsdp2_user_statistics` under FSDP1 (use_orig_params=True, a unit per Linear):
    each parameter's part is a flat view, none on some ranks."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    def wrap(model):
        return FullyShardedDataParallel(
            model,
            use_orig_params=True,
            device_id=torch.device("cpu"),
            auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        )

    fsdp2_user_statistics(rank, world, port, out, wrap=wrap)


def fsdp2_user_statistics(rank: int, world: int, port: int, out: str, wrap=None) -> None:
    """FSDP2 with uneven shards (7 and 5 rows, and a one-row layer: one rank's part is
    empty) beside an unsharded reference on the concatenated batch, both watched with the
    user statistics above: per step, each statistic's largest relative difference."""
    import copy

    from torch.distributed.fsdp import fully_shard

    import gradscope

    init(rank, world, port)
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 5), nn.Linear(5, 1))
    model = copy.deepcopy(reference)
    if wrap is None:
        for module in model:
            if next(module.parameters(), None) is not None:
                fully_shard(module)
        fully_shard(model)
    else:
        model = wrap(model)
    watch = gradscope.watch(model, statistics=_user_statistics())
    expected = gradscope.watch(reference, statistics=_user_statistics(), collectives=False)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, reference)]
    facts: dict = {"steps": []}
    for step in range(3):
        generator = torch.Generator().manual_seed(10 + step)
        x = torch.randn(4 * world, 6, generator=generator)
        y = torch.randn(4 * world, 1, generator=generator)
        mine = slice(4 * rank, 4 * rank + 4)
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        got = watch.collect(loss)
        whole = nn.functional.mse_loss(reference(x), y)
        whole.backward()
        want = expected.collect(whole)
        differences = {}
        for name in ("grad_sum", "grad_max", "grad_l2", "weight_dims"):
            if name not in want.figures:
                differences[name] = None if name not in got.figures else "unexpected"
                continue
            a, b = got.figures[name], want.figures[name]
            differences[name] = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
        facts["steps"].append(differences)
        for optimizer in optimizers:
            optimizer.step()
    watch.close()
    expected.close()
    Path(out, f"facts{rank}.json").write_text(json.dumps(facts, default=str))
    finish()
