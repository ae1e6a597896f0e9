"""``gradscope attach`` on unmodified scripts: the script's own output and exit code, one
recorded step per optimizer.step() with the model's layer names, and bad data in a batch
named as the input at its step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.optim import optimizer as optimizer_module

from gradscope.cli import main
from gradscope.cli.attach import split_attach_argv
from gradscope.core.recording import RecordingReader

TESTS = Path(__file__).parent
REPO = TESTS.parent
original_backward = torch.autograd.backward
original_clip = torch.nn.utils.clip_grad_norm_
original_scaler_step = torch.amp.GradScaler.step
MNIST = TESTS / "models" / "mnist_shaped.py"
GAN = TESTS / "models" / "gan_shaped.py"


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, timeout=240
    )


def _load(path: Path):
    with RecordingReader(path) as reader:
        _, history = reader.load()
        assert not reader.is_live()
        return history


def test_attach_keeps_the_scripts_output_and_exit_code_and_records_each_step(tmp_path):
    script_args = ["--epochs", "2", "--exit-code", "3"]
    plain = _python(str(MNIST), *script_args, cwd=tmp_path)
    record = tmp_path / "runs" / "mnist.gsrec"
    attached = _python(
        "-m", "gradscope", "attach", "--record", str(record), str(MNIST), *script_args, cwd=tmp_path
    )
    assert plain.returncode == 3, plain.stderr.decode()
    assert attached.returncode == 3, attached.stderr.decode()
    assert attached.stdout == plain.stdout  # byte for byte
    assert b"gradscope attach: watching Net" in attached.stderr
    steps = int(plain.stdout.decode().rsplit("optimizer steps: ", 1)[1])
    assert steps == 12  # 192 samples / 32 per batch, 2 epochs
    history = _load(record)
    assert history.steps.tolist() == list(range(steps))
    assert history.layer_names == ["conv1", "conv2", "fc1", "fc2"]
    assert history.first_nonfinite is None
    # the loss recorded is the one backward() was called on: the first logged one
    first_logged = float(plain.stdout.decode().split("Loss: ", 1)[1].split()[0])
    assert history.losses[0] == pytest.approx(first_logged, abs=1e-6)


def _attach(tmp_path, *args: str) -> int:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return main(["attach", *args])
    finally:
        os.chdir(cwd)


def test_a_nan_pixel_in_one_batch_is_the_input_origin_at_that_step(tmp_path, capfd):
    record = tmp_path / "nan.gsrec"
    code = _attach(
        tmp_path,
        "--record", str(record), "--fail-on-nonfinite", "--detail-every", "4",
        str(MNIST), "--epochs", "2", "--nan-batch", "6",
    )  # fmt: skip
    assert code == 1  # the script exited 0; --fail-on-nonfinite
    history = _load(record)
    assert history.steps.tolist() == list(range(12))
    origin = history.first_nonfinite
    # the first batch of epoch 2, after the test loop's no_grad calls (not part of it)
    assert (origin.step, origin.phase, origin.tensor) == (6, "input", "batch")
    assert origin.details["samples"] == [3]  # the image the script corrupted
    err = capfd.readouterr().err
    assert "first non-finite value: step 6: NaN in the batch (your data)" in err
    # no hook is left behind: a later model in this process is not watched
    assert not torch.nn.modules.module._has_any_global_hook()
    assert not torch.nn.modules.module._global_parameter_registration_hooks
    assert not torch.nn.modules.module._global_module_registration_hooks
    assert torch.nn.utils.clip_grad_norm_ is original_clip
    assert torch.nn.utils.clip_grad.clip_grad_norm_ is original_clip
    assert torch.amp.GradScaler.step is original_scaler_step
    assert not optimizer_module._global_optimizer_pre_hooks
    assert torch.autograd.backward is original_backward


def test_a_gan_gives_one_recording_per_model(tmp_path, capfd):
    record = tmp_path / "gan.gsrec"
    code = _attach(tmp_path, "--record", str(record), "--tensorboard", "tb", str(GAN), "4")
    assert code == 0
    out = capfd.readouterr().out
    assert out.count("Loss_D") == 4
    discriminator = _load(record)
    generator = _load(tmp_path / "gan.Generator.gsrec")
    assert discriminator.layer_names == ["main.0", "main.2"]
    assert discriminator.steps.tolist() == generator.steps.tolist() == [0, 1, 2, 3]
    # the discriminator's step loss: errD_real + errD_fake, as the script prints it
    first_d = float(out.split("Loss_D: ", 1)[1].split()[0])
    assert discriminator.losses[0] == pytest.approx(first_d, abs=1e-4)
    first_g = float(out.split("Loss_G: ", 1)[1].split()[0])
    assert generator.losses[0] == pytest.approx(first_g, abs=1e-4)
    for folder, history in (("tb", discriminator), ("tb/Generator", generator)):
        events = EventAccumulator(str(tmp_path / folder))
        events.Reload()
        written = {e.step: e.value for e in events.Scalars("gradscope/grad_norm/main.0")}
        recorded = history.series("grad_norm", "main.0").tolist()
        assert written == dict(enumerate(recorded))


def test_the_scripts_exception_is_its_own_traceback_and_exit_1(tmp_path, capfd):
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('before', sys.argv[1:])\nraise ValueError('bad data')\n")
    code = _attach(tmp_path, "--record", str(tmp_path / "x.gsrec"), str(script), "-v", "--x=1")
    captured = capfd.readouterr()
    plain = _python(str(script), "-v", "--x=1", cwd=tmp_path)
    assert code == plain.returncode == 1
    assert captured.out == plain.stdout.decode() == "before ['-v', '--x=1']\n"
    # the traceback python itself prints, frame for frame, then GradScope's own lines
    ours = [line for line in captured.err.splitlines() if line.startswith("gradscope attach:")]
    theirs = [line for line in captured.err.splitlines() if line not in ours]
    assert theirs == plain.stderr.decode().splitlines()
    assert "ValueError: bad data" in theirs[-1]
    assert "called no optimizer.step(): nothing was recorded" in ours[-1]


def test_a_missing_script_is_bad_input(tmp_path, capfd):
    assert _attach(tmp_path, str(tmp_path / "nope.py")) == 2
    assert "no script at" in capfd.readouterr().err


def test_options_stop_at_the_script():
    assert split_attach_argv(["--layers", "fc*", "conv1", "train.py", "--lr", "1"]) == (
        ["--layers", "fc*", "conv1"],
        ["train.py", "--lr", "1"],
    )
    assert split_attach_argv(["--record", "r.gsrec", "--open", "t.py", "--record"]) == (
        ["--record", "r.gsrec", "--open"],
        ["t.py", "--record"],
    )


def test_under_torchrun_each_rank_records_its_own_file(tmp_path):
    record = tmp_path / "ddp.gsrec"
    script = TESTS / "models" / "ddp_shaped.py"
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1")
    result = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "gradscope", "attach", "--record", str(record), str(script), "--nan-step", "2",
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 3 loss nan" in result.stdout
    assert sorted(p.name for p in tmp_path.glob("*.gsrec")) == [
        "ddp.rank0.gsrec",
        "ddp.rank1.gsrec",
    ]
    assert "watching Sequential (2 layers)" in result.stderr
    rank0, rank1 = _load(tmp_path / "ddp.rank0.gsrec"), _load(tmp_path / "ddp.rank1.gsrec")
    assert rank0.steps.tolist() == rank1.steps.tolist() == [0, 1, 2, 3]
    assert rank0.layer_names == rank1.layer_names == ["0", "2"]
    # DDP's averaged gradients: the same figures on both ranks
    assert (
        rank0.series("grad_norm", "0")[:2].tolist() == rank1.series("grad_norm", "0")[:2].tolist()
    )
    # rank 1's own batch held the NaN
    origin = rank1.first_nonfinite
    assert (origin.step, origin.phase, origin.details["samples"]) == (2, "input", [5])


def test_layers_and_open_reach_the_watch_and_the_app(tmp_path, monkeypatch):
    # The app itself is the app's tests' business; here: the command attach starts.
    from gradscope.core.attach import app_launch

    launched = []

    class StartedProcess:
        def __init__(self, argv, **options):
            launched.append(argv)

    monkeypatch.setattr(app_launch.subprocess, "Popen", StartedProcess)
    record = tmp_path / "some.gsrec"
    code = _attach(
        tmp_path, "--open", "--layers", "fc*", "conv1", "--record", str(record),
        str(MNIST), "--epochs", "1", "--samples", "64",
    )  # fmt: skip
    assert code == 0
    assert _load(record).layer_names == ["conv1", "fc1", "fc2"]
    assert [argv[1:] for argv in launched] == [["-m", "gradscope", "open", str(record)]]


def test_parameters_of_no_module_are_said_and_nothing_is_recorded(tmp_path, capfd):
    script = tmp_path / "bare.py"
    script.write_text(
        "import torch\n"
        "w = torch.nn.Parameter(torch.ones(3))\n"
        "opt = torch.optim.SGD([w], lr=0.1)\n"
        "for _ in range(3):\n"
        "    (w * 2).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "print('done')\n"
    )
    assert _attach(tmp_path, "--record", str(tmp_path / "b.gsrec"), str(script)) == 0
    captured = capfd.readouterr()
    assert captured.out == "done\n"
    assert "SGD steps parameters of no module (nn.Parameter objects outside" in captured.err
    assert "no optimizer.step() stepped the parameters of a module" in captured.err
    assert not (tmp_path / "b.gsrec").exists()
