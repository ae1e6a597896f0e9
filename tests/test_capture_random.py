"""CUDA's generator in the per-step capture (issue #34: its read, about 4 µs on an H200, cost
the 20-layer MLP 2.6% of its step there). It is read only for a forward that draws from it,
as the first forwards show, and the repeat of a forward that does draws what the step drew.
On a CPU: a stand-in for CUDA's generators, where gradscope.core.rng reads and writes them."""

import pytest
import torch
from torch import nn

import gradscope
from gradscope.core import replay as replay_module
from gradscope.core import rng


class StandInCudaGenerators:
    """One "device" generator: a state that a draw advances (as a Philox offset does)."""

    def __init__(self) -> None:
        self.offset = 0
        self.reads = 0
        self.draws: list[int] = []

    def states(self) -> list[torch.Tensor]:
        self.reads += 1
        return [torch.tensor([self.offset], dtype=torch.int64)]

    def set_states(self, states: list[torch.Tensor]) -> None:
        self.offset = int(states[0][0])

    def draw(self) -> int:
        self.draws.append(self.offset)
        self.offset += 4
        return self.draws[-1]


@pytest.fixture
def generators(monkeypatch) -> StandInCudaGenerators:
    found = StandInCudaGenerators()
    monkeypatch.setattr(rng, "cuda_started", lambda: True)
    monkeypatch.setattr(replay_module, "cuda_started", lambda: True)
    monkeypatch.setattr(rng, "_cuda_states", found.states)
    monkeypatch.setattr(rng, "_set_cuda_states", found.set_states)
    return found


class RowRoot(nn.Module):
    """sqrt of each row's sum of |x|: NaN in backward where a row is all zero."""

    def __init__(self, generators: StandInCudaGenerators | None = None) -> None:
        super().__init__()
        self.generators = generators

    def forward(self, x):
        if self.generators is not None:
            self.generators.draw()  # as CUDA dropout would
        return x.abs().sum(-1).sqrt()


def _steps(model, watch, steps: int, reads_after_learning: list[int] | None = None, gen=None):
    found = []
    for step in range(steps):
        model.zero_grad()
        x = torch.randn(4, 3)
        if step == steps - 1:
            x = torch.zeros(4, 3)
            model[0].bias.data.zero_()
        before = gen.reads if gen is not None else 0
        loss = model(x).sum()
        loss.backward()
        if reads_after_learning is not None and gen is not None:
            reads_after_learning.append(gen.reads - before)
        found.append(watch.collect(loss))
    return found


def test_a_forward_that_draws_nothing_from_cuda_costs_no_read(generators):
    """After the first forwards show that the forward draws from no CUDA generator, the
    capture reads none (before, every step's forward read every CUDA generator), and a
    NaN step is still located."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    watch = gradscope.watch(model)
    reads: list[int] = []
    found = _steps(model, watch, 8, reads, generators)
    watch.close()
    assert all(count >= 1 for count in reads[:3])  # the learning forwards
    assert reads[3:] == [0] * 5
    origin = found[-1].origin
    assert (origin.phase, origin.module) == ("backward", "1"), origin


def test_a_forward_that_draws_from_cuda_is_repeated_with_the_same_draws(generators):
    """A forward that draws from the CUDA generator keeps it captured at every step; the
    repeat of the NaN step draws what the step drew, and the run's generator is left where
    the step left it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot(generators))
    watch = gradscope.watch(model)
    reads: list[int] = []
    found = _steps(model, watch, 6, reads, generators)
    watch.close()
    assert all(count >= 1 for count in reads)
    origin = found[-1].origin
    assert (origin.phase, origin.module) == ("backward", "1"), origin
    step_draw, *repeat_draws = generators.draws[5:]
    assert repeat_draws and set(repeat_draws) == {step_draw}
    assert generators.offset == step_draw + 4  # where the step left it


def test_cuda_initialised_after_the_first_forwards_is_learned_about_again(monkeypatch):
    """CUDA started after the capture learned (a model moved to the GPU later): the next
    forwards learn whether the forward draws from CUDA's generator, then stop reading it."""
    generators = StandInCudaGenerators()
    started = [False]
    monkeypatch.setattr(rng, "cuda_started", lambda: started[0])
    monkeypatch.setattr(replay_module, "cuda_started", lambda: started[0])
    monkeypatch.setattr(rng, "_cuda_states", generators.states)
    monkeypatch.setattr(rng, "_set_cuda_states", generators.set_states)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), RowRoot())
    watch = gradscope.watch(model)
    reads: list[int] = []
    _steps(model, watch, 4, reads, generators)
    assert reads == [0] * 4 and watch.replay._post_only
    started[0] = True
    reads.clear()
    found = _steps(model, watch, 9, reads, generators)
    watch.close()
    # the forward after CUDA started only notices; the next three learn; then no read
    assert reads[0] == 0 and all(count >= 1 for count in reads[1:4]) and reads[4:] == [0] * 5
    assert watch.replay._cuda_draws is False
    assert found[-1].origin.phase == "backward"
