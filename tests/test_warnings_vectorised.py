"""Early warnings (#37): the detectors on a whole vector of layers (``LayerObservations``)
find what they find on each layer's scalar ``Observation``s, warning for warning and word for
word, on random series that spike, drift, sit near their limits, skip non-finite and
non-positive values, and change their set of layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradscope.core.warnings import EarlyWarnings, LayerObservations, Observation, drift
from gradscope.core.warnings.monitor import EXPONENT, MAGNITUDE

DTYPES = (torch.float16, torch.bfloat16, torch.float32, None, torch.int32)


def _series(rng: np.random.Generator, steps: int, scale: str) -> np.ndarray:
    """One layer's values: a noisy level that may drift, spike, approach a limit or go
    non-finite for a while."""
    level = rng.uniform(-2.0, 12.0) if scale == EXPONENT else 10.0 ** rng.uniform(-6, 4.5)
    noise = rng.uniform(0.0, 0.4)
    values = level * np.exp(noise * rng.standard_normal(steps))
    if scale == EXPONENT:
        values = level + noise * rng.standard_normal(steps)
    kind = rng.integers(0, 6)
    start = int(rng.integers(0, steps))
    if kind == 1:  # a drift from some step on
        rate = rng.uniform(0.02, 0.2)
        ramp = np.maximum(0, np.arange(steps) - start)
        values = values + rate * ramp if scale == EXPONENT else values * np.exp(rate * ramp)
    elif kind == 2:  # spikes
        where = rng.integers(0, steps, size=3)
        values[where] = values[where] + 5 if scale == EXPONENT else values[where] * 50
    elif kind == 4:  # a climb, a fall and the same climb again (back to an old high)
        rate, length = rng.uniform(0.05, 0.15), 30
        ramp = np.minimum(np.arange(steps) % (2 * length), length).astype(float)
        ramp[: 2 * length] *= 1.2
        values = values + rate * ramp if scale == EXPONENT else values * np.exp(rate * ramp)
    elif kind == 3:  # non-finite, zero or negative now and then
        where = rng.integers(0, steps, size=6)
        values[where] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -1.0], size=6)
    return values


def _run(
    seed: int, scale: str, detectors: tuple[str, ...], steps: int = 160, every: int = 1
) -> None:
    """Both paths on the same series; from step 60 on, a sample every ``every`` steps (the
    warnings' schedule after its dense start)."""
    rng = np.random.default_rng(seed)
    width = 12
    names = [f"layer{i}" for i in range(width)]
    table = np.stack([_series(rng, steps, scale) for _ in range(width)], axis=1)
    dtypes = tuple(DTYPES[i] for i in rng.integers(0, len(DTYPES), size=width))
    kinds = tuple(rng.choice(["Linear", "Attention", "ReLU"]) for _ in range(width))
    scalar, vector = EarlyWarnings(), EarlyWarnings()
    for sample in range(steps):
        step = sample if sample < 60 else 60 + (sample - 60) * every
        order = list(range(width))
        if sample >= steps // 2:  # the watched layers change: one gone, the order new
            order = order[1:][::-1]
        shown = tuple(names[i] for i in order)
        values = table[sample, order]
        kept = tuple(dtypes[i] for i in order)
        types = tuple(kinds[i] for i in order)
        loss = Observation(None, "loss", float(abs(values[0]) + 1.0), detectors=("spike",))
        scalar.observe(
            step,
            [
                loss,
                *(
                    Observation(name, "q", float(value), dtype, scale, detectors, kind)
                    for name, value, dtype, kind in zip(shown, values, kept, types, strict=True)
                ),
            ],
        )
        layers = LayerObservations(shown, "q", values, kept, scale, detectors, types)
        vector.observe(step, [loss, layers])
    expected = [w.describe() for w in scalar.warnings]
    assert [w.describe() for w in vector.warnings] == expected
    assert vector.warnings == scalar.warnings


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("scale", [MAGNITUDE, EXPONENT])
@pytest.mark.parametrize("every", [1, 10])
def test_layer_vectors_warn_as_scalar_observations_do(seed, scale, every):
    _run(seed, scale, ("headroom", "spike", "drift"), every=every)


@pytest.mark.parametrize("seed", range(4))
def test_layer_vectors_with_some_detectors_warn_as_scalar_observations_do(seed):
    _run(seed, MAGNITUDE, ("headroom",))
    _run(seed + 100, EXPONENT, ("headroom", "drift"))


def test_the_random_series_do_warn_of_every_kind():
    """The comparison above means something only if the series make each detector fire."""
    kinds = set()
    for seed in range(12):
        rng = np.random.default_rng(seed)
        monitor = EarlyWarnings()
        table = np.stack([_series(rng, 160, MAGNITUDE) for _ in range(12)], axis=1)
        names = tuple(f"layer{i}" for i in range(12))
        for step in range(160):
            layers = LayerObservations(names, "q", table[step], (torch.float16,) * 12)
            monitor.observe(step, [layers])
        kinds |= {w.kind for w in monitor.warnings}
    assert kinds == {"low headroom", "spiking", "drifting"}
    assert drift.WINDOW + drift.BASELINE < 160
