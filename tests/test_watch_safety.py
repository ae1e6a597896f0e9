"""The one watch in a user's own loop: origins on every watch, a diagnosis that never breaks
the run, and a parameter set that follows the model."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import gradscope
from gradscope.core.errors import GradScopeError
from gradscope.core.watch import (
    STATUS_FROZEN,
    STATUS_NAMES,
    STATUS_NO_GRADIENT,
    STATUS_NONFINITE,
    STATUS_OK,
    GradientWatch,
)


class Gate(nn.Module):
    """Passes its input through until broken; then its own code makes NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x - x.max() - 1.0) if self.broken else x


def gated_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), Gate(), nn.Linear(8, 1))


def one_step(model, watch, *, locate=True, **collect):
    x, y = torch.randn(4, 6), torch.randn(4, 1)

    def compute_loss():
        return nn.functional.mse_loss(model(x), y)

    model.zero_grad(set_to_none=True)
    loss = compute_loss()
    loss.backward()
    return watch.collect(loss, locate=compute_loss if locate else None, **collect)


def test_plain_watch_returns_the_located_origin():
    model = gated_model()
    watch = gradscope.watch(model)
    assert one_step(model, watch).origin is None
    model[2].broken = True
    stats = one_step(model, watch)
    origin = stats.origin
    assert stats.nonfinite and origin is not None
    assert (origin.phase, origin.module, origin.kind, origin.op) == (
        "forward",
        "2",
        "nan",
        "torch.sqrt",
    )
    assert origin.file == __file__ and "torch.sqrt" in origin.code
    assert watch.first_origin is origin and watch.origins == [origin]


def test_every_episode_gets_an_origin_and_its_steps_do_not():
    model = gated_model()
    watch = gradscope.watch(model)
    origins = []
    for step in range(9):
        model[2].broken = step in (2, 3, 6)
        origins.append(one_step(model, watch).origin)
    assert [i for i, o in enumerate(origins) if o is not None] == [2, 6]
    assert [o.step for o in watch.origins] == [2, 6]
    assert all(o.phase == "forward" and o.module == "2" for o in watch.origins)


def test_located_episodes_are_limited_and_the_rest_still_get_an_origin():
    model = gated_model()
    watch = gradscope.watch(model, max_located=1)
    calls = []

    def step(broken):
        model[2].broken = broken
        x = torch.randn(4, 6)

        def compute_loss():
            calls.append(1)
            return model(x).square().mean()

        model.zero_grad(set_to_none=True)
        loss = compute_loss()
        loss.backward()
        return watch.collect(loss, locate=compute_loss)

    for broken in (True, False, True, False, True):
        step(broken)
    assert len(calls) == 5 + 1  # one re-run, for the first episode only
    assert [o.step for o in watch.origins] == [0, 2, 4]
    assert watch.origins[0].module == "2"
    assert "max_located" in watch.origins[1].details["reason"]


def test_a_rerun_that_raises_gives_unknown_and_the_loop_goes_on():
    model = gated_model()
    watch = gradscope.watch(model)
    model[2].broken = True
    x = torch.randn(4, 6)
    loss = model(x).square().mean()
    loss.backward()

    def broken_locate():
        raise RuntimeError("my data loader is exhausted")

    stats = watch.collect(loss, locate=broken_locate)
    assert stats.nonfinite and stats.origin.phase == "unknown"
    assert "RuntimeError: my data loader is exhausted" in stats.origin.details["reason"]
    assert np.isnan(stats.loss)
    model[2].broken = False
    assert not one_step(model, watch).nonfinite  # training continues


def test_a_finite_rerun_says_what_locate_must_repeat():
    model = gated_model()
    watch = gradscope.watch(model)
    x = torch.randn(4, 6)
    loss = model(x).square().mean() * float("inf")  # the loop scaled it; locate() does not
    loss.backward()
    stats = watch.collect(loss, locate=lambda: model(x).square().mean())
    origin = stats.origin
    assert origin.phase == "unknown" and origin.details["statistics_phase"] == "loss"
    assert "re-run of this step was finite" in origin.details["reason"]
    assert "autocast" in origin.details["reason"]


def test_a_rerun_past_its_time_limit_stops_at_the_next_operation():
    model = gated_model()
    watch = gradscope.watch(model, locate_timeout=0.2)
    model[2].broken = True
    x = torch.randn(4, 6)
    calls = []

    def slow_locate():
        loss = model(x).square().mean()
        for _ in range(10_000):  # many operations, each checks the deadline
            calls.append(1)
            loss = loss + torch.zeros(())
            time.sleep(0.001)
        return loss

    loss = model(x).square().mean()
    loss.backward()
    started = time.monotonic()
    stats = watch.collect(loss, locate=slow_locate)
    assert time.monotonic() - started < 2.0
    assert stats.origin.phase == "unknown"
    assert "longer than 0.2 s" in stats.origin.details["reason"]
    done = len(calls)
    assert done < 10_000
    time.sleep(0.05)
    assert len(calls) == done  # nothing of the re-run runs after collect() returned


def test_the_rerun_leaves_the_random_stream_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.5), Gate(), nn.Linear(16, 1))
    model[2].broken = True
    watch = gradscope.watch(model)
    x = torch.randn(4, 6)

    def compute_loss():
        return model(x).square().mean()

    loss = compute_loss()
    loss.backward()
    state = torch.get_rng_state()
    stats = watch.collect(loss, locate=compute_loss)  # the re-run draws dropout masks
    assert stats.origin.phase == "forward"
    after = torch.rand(5)
    torch.set_rng_state(state)
    assert torch.equal(after, torch.rand(5))


def test_checkpointed_nan_does_not_break_collect():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(6, 6)
            self.gate = Gate()

        def forward(self, x):
            return self.gate(torch.tanh(self.inner(x)))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()
            self.head = nn.Linear(6, 1)

        def forward(self, x):
            return self.head(checkpoint(self.block, x, use_reentrant=False))

    torch.manual_seed(0)
    model = Model()
    model.block.gate.broken = True
    watch = gradscope.watch(model)
    x = torch.randn(4, 6)

    def compute_loss():
        return model(x).square().mean()

    loss = compute_loss()
    loss.backward()
    stats = watch.collect(loss, locate=compute_loss)
    assert stats.nonfinite and stats.origin is not None
    model.block.gate.broken = False
    assert not one_step(model, watch).nonfinite


def test_compiled_model_names_and_an_eager_rerun():
    compiled_frames = []

    def counting_backend(graph_module, example_inputs):
        compiled_frames.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    model = gated_model()
    compiled = torch.compile(model, backend=counting_backend)
    watch = gradscope.watch(compiled)
    assert [layer.name for layer in watch.layers] == ["0", "3"]  # no "_orig_mod." prefix
    x = torch.randn(4, 6)
    model[2].broken = True

    def compute_loss():
        return compiled(x).square().mean()

    loss = compute_loss()
    loss.backward()
    before = len(compiled_frames)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = watch.collect(loss, locate=compute_loss)
    assert stats.origin.phase == "forward" and stats.origin.module == "2"
    assert len(compiled_frames) == before  # the re-run did not go through dynamo
    torch._dynamo.reset()


# -- the parameter set follows the model ---------------------------------------------------
def backbone_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 1))
    for p in model[0].parameters():
        p.requires_grad_(False)
    return model


def test_frozen_layers_are_watched_from_the_start_and_unfreezing_is_picked_up():
    model = backbone_model()
    watch = gradscope.watch(model)
    assert [layer.name for layer in watch.layers] == ["0", "2", "3"]
    stats = one_step(model, watch)
    assert stats.status.tolist() == [STATUS_FROZEN, STATUS_OK, STATUS_OK]
    assert stats.weight_norm[0] == pytest.approx(
        float(
            torch.linalg.vector_norm(
                torch.cat([p.detach().reshape(-1) for p in model[0].parameters()])
            )
        ),
        rel=1e-6,
    )

    for p in model[0].parameters():  # unfreeze the backbone, as fine-tuning does
        p.requires_grad_(True)
    stats = one_step(model, watch)
    assert stats.status.tolist() == [STATUS_OK] * 3
    assert stats.grad_norm[0] == pytest.approx(
        float(
            torch.linalg.vector_norm(
                torch.cat([model[0].weight.grad.reshape(-1), model[0].bias.grad.reshape(-1)])
            )
        ),
        rel=1e-5,
    )

    with torch.no_grad():  # a NaN in the unfrozen layer is flagged
        model[0].weight[0, 0] = float("nan")
    stats = one_step(model, watch)
    assert stats.status[0] == STATUS_NONFINITE and stats.nonfinite


def test_no_gradient_is_not_vanishing_and_tied_parameters_count_once():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.unused = nn.Linear(4, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    model = Tied()
    watch = gradscope.watch(model)
    names = [layer.name for layer in watch.layers]
    assert names == ["embed", "unused", "head"]
    head = watch.layers[2]
    assert head.tied == ("embed.weight",) and head.num_params == 0
    assert sum(layer.num_params for layer in watch.layers) == sum(
        p.numel() for p in model.parameters()
    )
    model(torch.randint(0, 10, (3, 5))).square().mean().backward()
    stats = watch.collect()
    assert STATUS_NAMES[stats.status[1]] == "no gradient"
    assert stats.status[1] == STATUS_NO_GRADIENT
    grad = model.embed.weight.grad
    assert (
        stats.grad_norm[0]
        == stats.grad_norm[2]
        == pytest.approx(float(torch.linalg.vector_norm(grad)), rel=1e-5)
    )


def test_layer_patterns_that_match_nothing_or_only_frozen_layers():
    model = backbone_model()
    with pytest.raises(GradScopeError, match="no layer matches 'encoder"):
        gradscope.watch(model, layers=["encoder.*"])
    with pytest.raises(GradScopeError, match="only modules without parameters"):
        gradscope.watch(model, layers=["1"])  # the ReLU
    with pytest.warns(UserWarning, match="match only frozen layers") as seen:
        watch = gradscope.watch(model, layers=["0"])
    assert len(seen) == 1 and seen[0].filename == __file__
    assert one_step(model, watch).status.tolist() == [STATUS_FROZEN]


def test_gradient_accumulation_several_watches_and_optimizers():
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6))
    discriminator = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    g_opt = torch.optim.SGD(generator.parameters(), lr=0.1)
    d_opt = torch.optim.Adam(discriminator.parameters(), lr=0.01)
    g_watch = gradscope.watch(generator, update_ratio=True, optimizer=g_opt, detail_every=1)
    d_watch = gradscope.watch(discriminator, update_ratio=True, optimizer=[d_opt], detail_every=1)
    for _ in range(2):
        d_opt.zero_grad()
        for _micro in range(3):  # gradient accumulation: three backwards, one collect
            fake = generator(torch.randn(5, 4)).detach()
            (discriminator(fake).mean() / 3).backward()
        expected = float(torch.linalg.vector_norm(discriminator[0].weight.grad))
        d_stats = d_watch.collect()
        assert d_stats.param_grad_norm[0] == pytest.approx(expected, rel=1e-5)
        d_opt.step()
        assert d_stats.update_ratio is not None and (d_stats.update_ratio > 0).all()

        g_opt.zero_grad()
        discriminator(generator(torch.randn(5, 4))).mean().backward()
        g_stats = g_watch.collect()
        g_opt.step()
        assert g_stats.update_ratio is not None and (g_stats.update_ratio > 0).all()
    assert g_watch.step == d_watch.step == 2
    g_watch.close()
    d_watch.close()


# -- recordings next to the user's code ----------------------------------------------------
def test_recording_folders_missing_and_unwritable(tmp_path):
    model = gated_model()
    nested = tmp_path / "runs" / "today" / "x.gsrec"
    with gradscope.watch(model, record=nested) as watch:
        one_step(model, watch)
    assert nested.exists()
    not_a_folder = tmp_path / "notes.txt"
    not_a_folder.write_text("mine")
    with pytest.raises(GradScopeError, match=r"cannot create the folder .*notes.txt"):
        gradscope.watch(model, record=not_a_folder / "x.gsrec")
    assert not_a_folder.read_text() == "mine"


@contextlib.contextmanager
def read_only_view(folder: Path):
    """``folder`` seen through a read-only bind mount: real read-only storage, which root
    cannot write either (chmod does not stop root)."""
    view = folder.parent / (folder.name + "-ro")
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(folder), str(view)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here: {mounted.stderr.decode().strip()}")
    try:
        remounted = subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(view)], capture_output=True
        )
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {remounted.stderr.decode().strip()}")
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=False)


@pytest.mark.skipif(shutil.which("mount") is None, reason="no mount command")
def test_a_recording_on_read_only_storage_opens(tmp_path):
    from gradscope.core.recording import RecordingReader

    model = gated_model()
    folder = tmp_path / "archive"
    with gradscope.watch(model, record=folder / "done.gsrec") as watch:
        for _ in range(3):
            one_step(model, watch)
    with read_only_view(folder) as view:
        with pytest.raises(OSError):
            (view / "probe").write_text("")  # really read-only
        with RecordingReader(view / "done.gsrec") as reader:
            assert reader.load()[1].count == 3


def test_watch_accepts_a_model_output_with_its_loss():
    model = gated_model()
    watch = GradientWatch(model)
    x = torch.randn(4, 6)
    loss = model(x).square().mean()
    loss.backward()
    stats = watch.collect({"loss": loss, "logits": None})
    assert stats.loss == pytest.approx(float(loss))

    class Output:
        def __init__(self, loss):
            self.loss = loss

    assert watch.collect(Output(loss)).loss == pytest.approx(float(loss))
    with pytest.raises(TypeError, match="loss tensor"):
        watch.collect(("not", "a loss"))


FLAKY = """
import torch
from torch import nn

calls = {"n": 0}

class Flaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 1)

    def forward(self, x):
        calls["n"] += 1
        if calls["n"] == 2:  # the diagnosis re-run of the first step
            raise RuntimeError("this model cannot run a step twice")
        out = self.lin(x)
        return torch.log(out - out.max()) if calls["n"] == 1 else out

def build_model():
    return Flaky()

def make_batch(batch_size, device):
    return torch.randn(batch_size, 10), torch.randn(batch_size, 1)
"""


def test_gradscope_run_goes_on_when_its_diagnosis_fails(write_script, tmp_path, capsys):
    from gradscope.cli import main

    script = write_script(FLAKY)
    report = tmp_path / "run.json"
    code = main(["run", str(script), "--steps", "3", "--keep-going", "--json", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "origin not located: the re-run raised" in out and "cannot run a step twice" in out
    data = json.loads(report.read_text())
    assert data["steps_run"] == 3
    assert data["first_nonfinite"]["phase"] == "unknown"
    assert "cannot run a step twice" in data["first_nonfinite"]["reason"]


def test_a_timed_out_rerun_still_restores_gradients_and_buffers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    watch = gradscope.watch(model, locate_timeout=0.2)
    x = torch.randn(4, 6)
    x[0, 0] = float("nan")
    loss = model(x).square().mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]

    def slow_locate():
        loss = model(x).square().mean()  # a forward, then past the deadline
        time.sleep(0.3)
        return loss + 0.0

    stats = watch.collect(loss, locate=slow_locate)
    assert "longer than 0.2 s" in stats.origin.details["reason"]
    for p, g in zip(model.parameters(), grads, strict=True):
        assert p.grad is not None and torch.equal(p.grad.nan_to_num(), g.nan_to_num())
    for b, before in zip(model.buffers(), buffers, strict=True):
        assert torch.equal(b.nan_to_num(), before.nan_to_num())


@pytest.mark.parametrize("small", [True, False])
def test_sparse_embedding_that_stores_nothing(small, monkeypatch):
    from gradscope.core.watch import binding as binding_module

    if not small:  # the per-tensor (BLAS) path as well as the stacked one
        monkeypatch.setattr(binding_module, "SMALL_NUMEL", 0)
    embedding = nn.Embedding(10, 4, sparse=True, padding_idx=0)
    watch = gradscope.watch(embedding, detail_every=1)
    embedding(torch.zeros(3, dtype=torch.long)).sum().backward()  # only padding: nnz 0
    stats = watch.collect()
    assert stats.grad_norm.tolist() == [0.0] and stats.max_abs.tolist() == [0.0]
    embedding.zero_grad()
    embedding(torch.tensor([1, 2])).sum().backward()
    stats = watch.collect()
    assert stats.grad_norm[0] == pytest.approx(2.0**0.5 * 2.0) and stats.max_abs[0] == 1.0


def test_every_episode_reaches_the_recording_the_report_and_the_json(tmp_path, capsys):
    from gradscope.cli import main
    from gradscope.core.recording import RecordingReader
    from gradscope.core.report import build_report

    model = gated_model()
    with gradscope.watch(model, record=tmp_path / "e.gsrec") as watch:
        for step in range(8):
            model[2].broken = step in (1, 5)
            one_step(model, watch)
    with RecordingReader(tmp_path / "e.gsrec") as reader:
        _, history = reader.load()
    assert [o.step for o in history.origins] == [1, 5]
    assert history.first_nonfinite.step == 1
    origins = build_report("e", "cpu", history)["nonfinite_origins"]
    assert [(o["step"], o["module"], o["op"]) for o in origins] == [
        (1, "2", "torch.sqrt"),
        (5, "2", "torch.sqrt"),
    ]
    out = tmp_path / "r.json"
    assert main(["report", str(tmp_path / "e.gsrec"), "--json", str(out)]) == 0
    capsys.readouterr()
    assert [o["step"] for o in json.loads(out.read_text())["nonfinite_origins"]] == [1, 5]


def test_complex_parameters():
    class Spectral(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 4, dtype=torch.complex64))

        def forward(self, x):
            return (x.to(torch.complex64) @ self.weight).abs()

    model = Spectral()
    watch = gradscope.watch(model, detail_every=1)
    model(torch.randn(3, 4)).sum().backward()
    stats = watch.collect()
    grad = model.weight.grad
    assert stats.grad_norm[0] == pytest.approx(float(torch.linalg.vector_norm(grad)), rel=1e-5)
    assert stats.max_abs[0] == pytest.approx(float(grad.abs().max()), rel=1e-6)
    assert stats.weight_norm[0] == pytest.approx(
        float(torch.linalg.vector_norm(model.weight.detach())), rel=1e-5
    )
    assert not stats.nonfinite


def test_activation_checkpoint_wrappers_keep_the_users_layer_names():
    """checkpoint_wrapper (as used with FSDP) inserts _checkpoint_wrapped_module into every
    name; the watch names layers as the user wrote them, with the same figures."""
    import copy

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    wrapped = copy.deepcopy(plain)
    apply_activation_checkpointing(wrapped, check_fn=lambda m: isinstance(m, nn.Linear))
    assert any("_checkpoint_wrapped_module" in n for n, _ in wrapped.named_parameters())
    x = torch.randn(3, 4)
    watches = [gradscope.watch(m, detail_every=1) for m in (plain, wrapped)]
    got = []
    for model, watch in zip((plain, wrapped), watches, strict=True):
        model(x).pow(2).sum().backward()
        got.append(watch.collect())
    assert [layer.name for layer in watches[1].layers] == ["0", "2", "4"]
    assert watches[1].param_names == watches[0].param_names
    np.testing.assert_allclose(got[1].grad_norm, got[0].grad_norm, rtol=1e-6)


def _deferred_model() -> nn.Module:
    """Built on the meta device and given real storage by to_empty(), as large models and
    FSDP2 scripts do; init covers every layer but the second (its weight is NaN here, as
    uninitialised memory may be)."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 6), nn.Linear(6, 1))
    return model


def _initialise(model: nn.Module, *, miss_second: bool) -> None:
    torch.manual_seed(0)
    model.to_empty(device="cpu")
    for index in (0, 2, 3):
        model[index].reset_parameters()
    if miss_second:
        with torch.no_grad():
            model[2].weight.fill_(float("nan"))
    else:
        model[2].reset_parameters()


@pytest.mark.parametrize("located", [True, False])
def test_a_watch_made_on_the_meta_device_follows_to_empty_and_names_the_missed_init(located):
    model = _deferred_model()
    watch = gradscope.watch(model)  # before to_empty: no values to read yet
    _initialise(model, miss_second=True)
    x = torch.randn(3, 4)
    loss = model(x).sum()
    loss.backward()
    stats = watch.collect(loss, locate=(lambda: model(x).sum()) if located else None)
    origin = stats.origin
    assert origin.phase == "update" and origin.module == "2"
    assert origin.details["at_start"] and origin.step == 0
    assert "never initialised" in origin.describe()
    assert "reset_parameters()" in origin.details["hint"]


def test_a_watch_made_on_the_meta_device_reads_the_real_weights_after_to_empty(tmp_path):
    model = _deferred_model()
    watch = gradscope.watch(model, detail_every=1, record=tmp_path / "deferred.gsrec")
    _initialise(model, miss_second=False)
    reference = gradscope.watch(model, detail_every=1)
    model(torch.randn(3, 4)).sum().backward()
    got, expected = watch.collect(), reference.collect()
    np.testing.assert_array_equal(got.grad_norm, expected.grad_norm)
    np.testing.assert_array_equal(got.weight_norm, expected.weight_norm)
    assert got.weight_norm.min() > 0
    watch.close()
    from gradscope.core.recording import RecordingReader

    with RecordingReader(tmp_path / "deferred.gsrec") as reader:
        assert reader.info["device"] == "cpu"  # not the meta device it was made on


def test_a_non_finite_loss_from_statistics_alone_does_not_blame_the_loss_code():
    model = nn.Linear(3, 1)
    watch = gradscope.watch(model)
    loss = model(torch.randn(2, 3)).sum() * float("nan")
    loss.backward()
    text = watch.collect(loss).origin.describe()
    assert "the loss was NAN (not re-run" in text
    assert "outside the model" not in text
