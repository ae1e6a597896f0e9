"""RunHistory.extend (the app's batched append) keeps exactly what append keeps."""

from __future__ import annotations

import numpy as np

from gradscope.core.history import STATISTICS, RunHistory
from gradscope.core.origin import Origin
from gradscope.core.watch import StepStats, classify


def _steps(names: list[str], count: int, first: int, rng: np.random.Generator) -> list:
    layers = len(names)
    steps = []
    for step in range(first, first + count):
        norms = 10.0 ** rng.uniform(-9, 4, layers)  # crosses both thresholds often
        if step % 7 == 3:
            norms[step % layers] = np.nan
        if step % 11 == 5:
            norms[(step + 1) % layers] = 1e300  # beyond float32: saturates, not Inf
        zeros = np.zeros(layers, dtype=np.int64)
        nan_count = np.isnan(norms).astype(np.int64)
        stats = StepStats(
            step=step, loss=float(rng.normal()), total_grad_norm=float(np.nansum(norms)),
            grad_norm=norms, max_abs=norms / 3, weight_norm=rng.uniform(0, 2, layers),
            nan_count=nan_count, inf_count=zeros,
            status=classify(norms, nan_count, 1000.0, 1e-7), param_grad_norm=norms,
            update_ratio=None if step % 5 == 0 else rng.uniform(0, 1e-3, layers),
        )
        steps.append((step, stats.loss, stats, None))
    return steps


def _same(a: RunHistory, b: RunHistory) -> None:
    assert a.count == b.count and a.layer_names == b.layer_names
    assert a.layer_types == b.layer_types and a.layer_params == b.layer_params
    assert np.array_equal(a.steps, b.steps)
    assert np.array_equal(a.losses, b.losses)
    assert np.array_equal(a.total_grad_norm[: a.count], b.total_grad_norm[: b.count])
    for name in STATISTICS:
        assert np.array_equal(a.matrix(name), b.matrix(name), equal_nan=True), name
    assert np.array_equal(a.status_matrix(), b.status_matrix())
    assert np.array_equal(a.worst_status, b.worst_status)
    assert a.events == b.events
    assert a.first_nonfinite == b.first_nonfinite


def test_extend_equals_appending_each_step() -> None:
    rng = np.random.default_rng(0)
    few, more = ["a", "b", "c"], ["a", "b", "c", "d", "e"]
    origin = Origin(step=44, phase="forward", module="b", tensor="output", kind="nan")
    batches = [
        (few, _steps(few, 1, 0, rng)),  # a batch of one
        (few, _steps(few, 30, 1, rng)),
        (more, _steps(more, 13, 31, rng)),  # new layers mid-run
        (few, _steps(few, 20, 44, rng)),  # fewer watched: the others stay MISSING
    ]
    step, loss, stats, _ = batches[3][1][0]
    batches[3][1][0] = (step, loss, stats, origin)  # a batch with the origin in it
    one_by_one, batched = RunHistory(capacity=4), RunHistory(capacity=4)
    for names, steps in batches:
        types, params = [n.upper() for n in names], list(range(len(names)))
        for step, loss, stats, found in steps:
            one_by_one.append(step, loss, stats, names, types, params, origin=found)
        batched.extend(steps, names, types, params)
    _same(one_by_one, batched)
    assert batched.first_nonfinite == origin
    assert {event.kind for event in batched.events} >= {"exploding", "vanishing",
                                                          "nonfinite", "origin"}
    # A history that went back and goes on with batches.
    one_by_one.rewind_to(20)
    batched.rewind_to(20)
    again = _steps(few, 25, 20, np.random.default_rng(1))
    for step, loss, stats, found in again:
        one_by_one.append(step, loss, stats, few, origin=found)
    batched.extend(again, few)
    _same(one_by_one, batched)


def test_a_rewound_branch_leaves_no_old_values_behind() -> None:
    """After a rewind, cells the new branch does not measure (an unwatched layer, no update
    ratio) read MISSING, not the forgotten branch's values."""
    from gradscope.core.history import MISSING, STATUS_MISSING

    rng = np.random.default_rng(2)
    both, one = ["a", "b"], ["a"]
    for batched in (False, True):
        history = RunHistory(capacity=4)
        history.extend(_steps(both, 6, 1, rng), both)  # steps 1-6, ratios on most
        history.rewind_to(4)
        again = [(step, loss, stats, None) for step, loss, stats, _ in _steps(one, 3, 4, rng)]
        for _, _, stats, _ in again:
            stats.update_ratio = None
        if batched:
            history.extend(again, one)
        else:
            for step, loss, stats, origin in again:
                history.append(step, loss, stats, one, origin=origin)
        rows = slice(3, 6)
        assert (history.matrix("grad_norm")[rows, 1] == MISSING).all()
        assert (history.status_matrix()[rows, 1] == STATUS_MISSING).all()
        assert (history.matrix("update_ratio")[rows] == MISSING).all()


def test_extend_with_a_repeated_layer_name_equals_appending() -> None:
    # append keeps one previous status per name: here the second "x" (ok) hides the first
    # (exploding), so every step is an onset for it; extend must say the same.
    names = ["x", "x", "y"]
    norms = np.array([5000.0, 1.0, 1.0])
    zeros = np.zeros(3, dtype=np.int64)
    steps = []
    for step in range(4):
        stats = StepStats(step=step, loss=1.0, total_grad_norm=1.0, grad_norm=norms,
                          max_abs=norms, weight_norm=norms, nan_count=zeros, inf_count=zeros,
                          status=classify(norms, zeros, 1000.0, 1e-7), param_grad_norm=norms)
        steps.append((step, 1.0, stats, None))
    one_by_one, batched = RunHistory(), RunHistory()
    for step, loss, stats, origin in steps:
        one_by_one.append(step, loss, stats, names, origin=origin)
    batched.extend(steps, names)
    assert len(one_by_one.events) == 4
    assert one_by_one.events == batched.events


def test_rewind_drops_an_update_origin_with_its_event() -> None:
    """An "update" origin names the step whose optimizer step wrote the bad weights (k - 1);
    it was found at step k, and its event is at k. Rewinding to k forgets both, or neither."""
    rng = np.random.default_rng(3)
    names = ["a", "b"]
    history = RunHistory()
    origin = Origin(step=3, phase="update", module="a", tensor="weight", kind="nan")
    for step, loss, stats, _ in _steps(names, 6, 0, rng):
        history.append(step, loss, stats, names, origin=origin if step == 4 else None)
    assert [e.step for e in history.events if e.kind == "origin"] == [4]
    history.rewind_to(4)
    assert history.first_nonfinite is None
    assert not [e for e in history.events if e.kind == "origin"]
    # The re-run of step 4 finds it again, with its event.
    for step, loss, stats, _ in _steps(names, 1, 4, rng):
        history.append(step, loss, stats, names, origin=origin)
    assert history.first_nonfinite is origin
    assert [e.step for e in history.events if e.kind == "origin"] == [4]
    history.rewind_to(5)  # a rewind after it keeps both
    assert history.first_nonfinite is origin
    assert [e.step for e in history.events if e.kind == "origin"] == [4]
