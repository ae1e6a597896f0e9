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


# -- wall-clock time and per-parameter norms ------------------------------------------------
def _watched_steps(count: int):
    """``count`` real steps of a small MLP under the watch: (watch, [stats])."""
    import torch

    import gradscope

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    watch = gradscope.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    all_stats = []
    for _ in range(count):
        optimizer.zero_grad()
        loss = model(torch.randn(16, 4)).square().mean()
        loss.backward()
        all_stats.append(watch.collect(loss))
        optimizer.step()
    return watch, all_stats


def _layout(watch):
    from gradscope.core.history import owner_layers

    names = [layer.name for layer in watch.layers]
    owners = owner_layers(watch.param_names, [la.param_names for la in watch.layers], names)
    return names, owners


def test_history_keeps_wall_time_and_each_parameters_norm() -> None:
    watch, all_stats = _watched_steps(6)
    names, owners = _layout(watch)
    appended, extended = RunHistory(), RunHistory()
    for stats in all_stats:
        appended.append(stats.step, stats.loss, stats, names, param_names=watch.param_names,
                        param_layers=owners)
    extended.extend([(s.step, s.loss, s, None) for s in all_stats], names,
                    param_names=watch.param_names, param_layers=owners)
    for history in (appended, extended):
        assert history.has_wall_time()
        np.testing.assert_allclose(
            history.elapsed_seconds(),
            [s.wall_time - all_stats[0].wall_time for s in all_stats])
        norms = history.parameter_norms
        assert norms.layer_names == watch.param_names
        assert norms.params_of(["2"]) == ["2.weight", "2.bias"]
        np.testing.assert_allclose(
            norms.matrix(), np.stack([s.param_grad_norm for s in all_stats]), rtol=1e-6)
        np.testing.assert_array_equal(norms.steps, history.steps)
    appended.rewind_to(3)
    assert appended.parameter_norms.count == 3 and appended.has_wall_time()
    assert np.isnan(appended.wall_time[3:6]).all()


def test_steps_without_wall_time_offer_no_wall_clock_axis() -> None:
    import dataclasses

    watch, all_stats = _watched_steps(2)
    history = RunHistory()
    for stats in all_stats:
        history.append(stats.step, stats.loss, dataclasses.replace(stats, wall_time=None),
                       _layout(watch)[0])
    assert not history.has_wall_time()
    assert not RunHistory().has_wall_time()


def test_parameter_norms_stay_within_their_memory_bound() -> None:
    """Past the bound, every second (then fourth...) step is kept, spread over the whole
    run, and the buffer never grows beyond the bound."""
    watch, all_stats = _watched_steps(1)
    names, owners = _layout(watch)
    history = RunHistory()
    history.parameter_norms.budget_cells = 4 * 100  # 4 parameters x 100 steps
    template = all_stats[0]
    steps = [(i, 0.0, dataclasses_replace(template, step=i), None) for i in range(1000)]
    for start in range(0, 1000, 37):  # in batches, as the app appends
        history.extend(steps[start:start + 37], names, param_names=watch.param_names,
                       param_layers=owners)
    norms = history.parameter_norms
    assert norms.stride == 16 and 50 <= norms.count <= 100
    assert norms._values.size <= norms.budget_cells
    np.testing.assert_array_equal(norms.steps, np.arange(0, 1000, 16))
    assert history.count == 1000  # the layers' statistics keep every step


def dataclasses_replace(stats, **changes):
    import dataclasses

    return dataclasses.replace(stats, **changes)
