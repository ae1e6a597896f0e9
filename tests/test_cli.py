"""``gradscope run``: summary, strict JSON, exit codes, and one clear message per bad input
with no GradScope traceback."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from gradscope.cli import main

REPO = Path(__file__).resolve().parents[1]

GOOD = """
import torch
from torch import nn

def build_model():
    return nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 1))
def make_batch(batch_size, device):
    return torch.randn(batch_size, 10, device=device), torch.randn(batch_size, 1, device=device)
"""

NAN = GOOD.replace(
    "nn.Linear(50, 1))",
    "nn.Linear(50, 1))\nclass Log(nn.Module):\n    def forward(self, x):\n"
    "        return torch.log(x - x.max())\n",
).replace("nn.ReLU(),", "nn.ReLU(), Log(),")


def run(capsys, *argv):
    code = main(["run", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_error(code, err, *needles):
    assert code == 2
    assert err.startswith("gradscope: error:")
    assert "gradscope/core" not in err and "gradscope/cli" not in err
    for needle in needles:
        assert needle in err, err


def test_summary_and_strict_json(capsys, write_script, tmp_path):
    path = write_script(NAN)
    report = tmp_path / "r.json"
    code, out, _ = run(capsys, path, "--steps", 3, "--json", report)
    assert code == 0
    assert "first non-finite value: step 0: first NAN in forward, module '2'" in out
    text = report.read_text()

    def reject(constant):
        raise AssertionError(f"bare {constant} in JSON")

    data = json.loads(text, parse_constant=reject)  # strict: no bare NaN/Infinity
    assert data["steps_run"] == 1 and data["loss"] == ["nan"]
    assert data["first_nonfinite"]["phase"] == "forward"
    assert data["first_nonfinite"]["module"] == "2"
    assert data["first_nonfinite"]["line"] > 0
    assert data["first_nonfinite"]["op"] == "torch.log"
    assert "torch.log(x - x.max())" in data["first_nonfinite"]["code"]
    assert "negative" in data["first_nonfinite"]["hint"]  # NaN: log of negatives (#11)
    assert data["first_nonfinite"]["values"]["inputs"][0]["max"] == 0.0
    layers = {layer["name"]: layer for layer in data["layers"]}
    assert layers["3"]["status"] == "nonfinite"
    assert layers["3"]["grad_norm"] == ["nan"]
    assert set(data) == {
        "source", "device", "world_size", "settings", "steps_run", "steps", "loss",
        "total_grad_norm", "first_nonfinite", "nonfinite_origins", "error", "run_events",
        "warnings", "layers",
    }  # fmt: skip
    assert data["steps"] == [0] and data["total_grad_norm"] == ["nan"]
    assert data["world_size"] == 1 and data["error"] is None
    assert data["settings"]["steps"] == 3 and data["settings"]["device"] == "auto"


def test_fail_on_nonfinite_exit_code(capsys, write_script):
    path = write_script(NAN)
    assert run(capsys, path, "--steps", 2, "--fail-on-nonfinite")[0] == 1
    good = write_script(GOOD, "good.py")
    code, out, _ = run(capsys, good, "--steps", 2, "--fail-on-nonfinite")
    assert code == 0 and "first non-finite" not in out


def test_layers_by_glob(capsys, write_script, tmp_path):
    path = write_script(GOOD)
    report = tmp_path / "r.json"
    assert run(capsys, path, "--steps", 1, "--layers", "2", "--json", report)[0] == 0
    assert [layer["name"] for layer in json.loads(report.read_text())["layers"]] == ["2"]


def test_missing_file(capsys, tmp_path):
    code, _, err = run(capsys, tmp_path / "nope.py")
    assert_clean_error(code, err, "no such file", "nope.py")


def test_syntax_error_names_file_and_line(capsys, write_script):
    path = write_script("import torch\n\ndef build_model(:\n    pass\n")
    code, _, err = run(capsys, path)
    assert_clean_error(code, err, "syntax error", str(path), "line 3")


def test_script_that_raises_shows_its_own_traceback(capsys, write_script):
    path = write_script("import torch\n\ndef helper():\n    raise ValueError('boom')\n\nhelper()\n")
    code, _, err = run(capsys, path)
    assert_clean_error(code, err, "ValueError", "boom", f'File "{path}", line 4')


def test_build_model_that_raises(capsys, write_script):
    path = write_script(
        GOOD.replace(
            "    return nn.Sequential", "    raise KeyError('x')\n    return nn.Sequential"
        )
    )
    code, _, err = run(capsys, path)
    assert_clean_error(code, err, "build_model() raised KeyError", f'File "{path}"')


def test_no_build_model(capsys, write_script):
    path = write_script("x = 1\n")
    code, _, err = run(capsys, path)
    assert_clean_error(code, err, "defines no build_model()")


def test_no_make_batch_says_what_to_add(capsys, write_script):
    path = write_script("from torch import nn\ndef build_model():\n    return nn.Linear(2, 1)\n")
    code, _, err = run(capsys, path)
    assert_clean_error(code, err, "defines no make_batch()", "def make_batch(batch_size, device)")


def test_unknown_model_name_suggests_close_names(capsys):
    code, _, err = run(capsys, "resnet19")
    assert_clean_error(code, err, "'resnet19'", "did you mean", "resnet18")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_cuda_asked_but_absent(capsys, write_script):
    path = write_script(GOOD)
    code, _, err = run(capsys, path, "--device", "cuda")
    assert_clean_error(code, err, "CUDA is not available", "--device cpu")


def test_batch_that_does_not_fit_shows_both_shapes(capsys, write_script):
    path = write_script(GOOD.replace("torch.randn(batch_size, 10,", "torch.randn(batch_size, 12,"))
    code, _, err = run(capsys, path, "--batch-size", 5)
    assert_clean_error(code, err, "does not fit", "(5, 12)", "5x12", "10x50", "module '0'")


def test_target_shape_mismatch_shows_both_shapes(capsys, write_script):
    path = write_script(
        GOOD.replace("torch.randn(batch_size, 1, device", "torch.randn(batch_size, 3, device")
    )
    code, _, err = run(capsys, path, "--batch-size", 4)
    assert_clean_error(code, err, "(4, 1)", "(4, 3)")


def test_bad_setting(capsys, write_script):
    path = write_script(GOOD)
    code, _, err = run(capsys, path, "--lr", "-1")
    assert_clean_error(code, err, "lr must be")
    code, _, err = run(capsys, write_script(GOOD + "CONFIG = {'learning_rate': 1}\n", "c.py"))
    assert_clean_error(code, err, "'learning_rate'")


def test_entry_points_in_a_subprocess(write_script):
    """``python -m gradscope`` and the installed ``gradscope`` console script (next to the
    interpreter running the tests: .venv/bin/gradscope after `make test`) both run, and
    both run the gradscope under test (the model script prints which one it imports)."""
    import gradscope

    path = write_script(
        "import sys, gradscope\nprint('GRADSCOPE', gradscope.__file__, file=sys.stderr)\n" + GOOD
    )
    console_script = Path(sys.executable).parent / "gradscope"
    assert console_script.exists(), (
        f"no console script at {console_script}: install the package into this "
        "interpreter's environment (make test does: pip install -e .)"
    )
    # The gradscope under test first on the path, wherever this checkout lies (the
    # interpreter's editable install may point at another checkout of the repository).
    under_test = str(Path(gradscope.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [under_test, os.environ.get("PYTHONPATH")])),
    }
    for command in (
        [sys.executable, "-m", "gradscope", "run", str(path), "--steps", "2"],
        [str(console_script), "run", str(path), "--steps", "2"],
    ):
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        assert "layer" in result.stdout and "status" in result.stdout
        assert f"GRADSCOPE {gradscope.__file__}" in result.stderr.splitlines()


def test_torchvision_state_dict_is_loaded_weights_only(capsys, tmp_path):
    import torchvision

    from gradscope.core.sources import load_source

    torch.manual_seed(3)
    model = torchvision.models.squeezenet1_1()
    path = tmp_path / "squeeze.pt"
    torch.save(model.state_dict(), path)
    loaded = load_source("squeezenet1_1", image_size=64, weights=str(path))
    rebuilt = loaded.build_model()
    assert torch.equal(rebuilt.features[0].weight, model.features[0].weight)
    code, _, err = run(capsys, "squeezenet1_0", "--weights", path, "--steps", 1)
    assert_clean_error(code, err, "does not fit squeezenet1_0")
    code, _, err = run(capsys, "squeezenet1_0", "--weights", tmp_path / "none.pt")
    assert_clean_error(code, err, "no such weights file")


# -- the exit-code contract and nothing finished lost (#16) ------------------------------
FAILS_AT_STEP_3 = GOOD.replace(
    "def make_batch(batch_size, device):\n",
    "CALLS = []\n\ndef make_batch(batch_size, device):\n"
    "    CALLS.append(1)\n"
    "    if len(CALLS) == 4:\n"
    "        {failure}\n",
)


def assert_user_frames_only(err):
    assert "Traceback" not in err
    assert "gradscope/core" not in err and "gradscope/cli" not in err


def test_a_step_failing_in_user_code_keeps_the_finished_steps(capsys, write_script, tmp_path):
    path = write_script(FAILS_AT_STEP_3.format(failure="raise ValueError('bad row 17')"))
    report = tmp_path / "r.json"
    code, out, err = run(capsys, path, "--steps", 6, "--json", report)
    assert code == 2
    assert err.startswith("gradscope: error: model.py: make_batch() raised ValueError: bad row")
    assert f'File "{path}", line' in err and "raise ValueError('bad row 17')" in err
    assert_user_frames_only(err)
    assert "3 finished step(s)" in err
    assert "3 step(s)" in out and "layer" in out  # the table of the finished steps
    data = json.loads(report.read_text())
    assert data["steps_run"] == 3 and data["steps"] == [0, 1, 2]
    assert len(data["loss"]) == 3 and len(data["layers"][0]["grad_norm"]) == 3
    assert data["error"]["step"] == 3
    assert "bad row 17" in data["error"]["message"]
    assert any("raise ValueError('bad row 17')" in line for line in data["error"]["traceback"])


def test_out_of_memory_at_a_step_keeps_the_finished_steps(capsys, write_script, tmp_path):
    path = write_script(FAILS_AT_STEP_3.format(failure="torch.empty(10**13, device=device)"))
    report = tmp_path / "r.json"
    code, _out, err = run(capsys, path, "--steps", 6, "--json", report)
    assert code == 2
    assert err.startswith("gradscope: error: model.py: make_batch() ran out of memory")
    assert "tried to allocate 36.4 TiB" in err and "--batch-size" in err
    assert_user_frames_only(err)
    data = json.loads(report.read_text())
    assert data["steps"] == [0, 1, 2] and data["error"]["step"] == 3
    assert "out of memory" in data["error"]["message"]


def test_an_internal_error_exits_3_with_please_report(capsys, write_script, tmp_path, monkeypatch):
    from gradscope.core.runner import StepRunner

    original = StepRunner.apply

    def broken_apply(self, result):
        if result.step == 2:
            raise ZeroDivisionError("a GradScope bug")
        return original(self, result)

    monkeypatch.setattr(StepRunner, "apply", broken_apply)
    report = tmp_path / "r.json"
    code, _out, err = run(capsys, write_script(GOOD), "--steps", 5, "--json", report)
    assert code == 3
    assert err.startswith("gradscope: internal error: ZeroDivisionError: a GradScope bug")
    assert "please report" in err and "Traceback" in err and "broken_apply" in err
    data = json.loads(report.read_text())
    assert data["steps"] == [0, 1] and data["error"]["step"] == 2
    assert "please report" in data["error"]["message"]
    assert any("ZeroDivisionError" in line for line in data["error"]["traceback"])


def test_interrupt_during_the_steps_exits_130_and_keeps_them(capsys, write_script, tmp_path):
    # KeyboardInterrupt is what Ctrl+C raises in the main thread, wherever it lands.
    path = write_script(FAILS_AT_STEP_3.format(failure="raise KeyboardInterrupt"))
    report = tmp_path / "r.json"
    code, _out, err = run(capsys, path, "--steps", 6, "--json", report)
    assert code == 130
    assert err.strip().splitlines() == [
        "gradscope: interrupted; the summary and --json hold the 3 finished step(s)"
    ]
    data = json.loads(report.read_text())
    assert data["steps"] == [0, 1, 2] and data["error"]["step"] == 3
    assert data["error"]["message"].startswith("interrupted")


@pytest.mark.parametrize("where", ["build_model", "make_batch"])
def test_sys_exit_in_user_code_is_reported_not_a_silent_exit(capsys, write_script, where):
    text = GOOD.replace(f"def {where}(", f"def {where}(*a):\n    sys.exit(0)\ndef _old_{where}(")
    path = write_script("import sys\n" + text)
    code, _, err = run(capsys, path, "--steps", 2)
    assert_clean_error(code, err, f"{where}() called sys.exit(0)", f'File "{path}"')


def test_unwritable_json_path_is_refused_before_the_run(capsys, write_script, tmp_path):
    path = write_script(
        GOOD.replace("    return nn.Sequential", "    open(MARK, 'w')\n    return nn.Sequential")
        + f"MARK = {str(tmp_path / 'built')!r}\n"
    )
    code, _, err = run(capsys, path, "--json", tmp_path)
    assert_clean_error(code, err, "--json", "is a folder")
    code, _, err = run(capsys, path, "--json", tmp_path / "missing" / "r.json")
    assert_clean_error(code, err, "--json", "does not exist")
    assert not (tmp_path / "built").exists()  # refused before the model was built


def test_bad_batches_exit_2_naming_shapes_and_sizes(capsys, write_script):
    out_of_range = GOOD.replace("nn.Linear(50, 1))", "nn.Linear(50, 4))").replace(
        "torch.randn(batch_size, 1, device=device)",
        "torch.arange(batch_size, device=device) * 3",
    )
    code, _, err = run(capsys, write_script(out_of_range, "range.py"), "--batch-size", 4)
    assert_clean_error(code, err, "class labels 0..9", "4 classes", "output (4, 4)")
    assert_user_frames_only(err)
    wrong_length = out_of_range.replace("torch.arange(batch_size,", "torch.arange(batch_size - 1,")
    code, _, err = run(capsys, write_script(wrong_length, "length.py"), "--batch-size", 4)
    assert_clean_error(code, err, "3 labels for a batch of 4", "output (4, 4)", "target (3,)")
    code, _, err = run(capsys, write_script(GOOD, "good.py"), "--batch-size", 10**12)
    assert_clean_error(code, err, "ran out of memory", "TiB", "--batch-size")
    assert_user_frames_only(err)
    code, _, err = run(capsys, "squeezenet1_1", "--image-size", 100000, "--steps", 1)
    assert_clean_error(code, err, "100000x100000", "894.1 GiB", "--image-size")


def test_script_imports_a_module_next_to_it_from_anywhere(capsys, tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "gs16_sibling_layers.py").write_text(
        "from torch import nn\ndef block():\n    return nn.Linear(10, 1)\n"
    )
    script = folder / "model.py"
    script.write_text(
        GOOD.replace("import torch\n", "import torch\nimport gs16_sibling_layers\n", 1).replace(
            "return nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 1))",
            "return gs16_sibling_layers.block()",
        )
    )
    monkeypatch.chdir(tmp_path)  # not the script's folder
    monkeypatch.setattr(sys, "path", list(sys.path))  # the insertion is undone after the test
    monkeypatch.delitem(sys.modules, "gs16_sibling_layers", raising=False)
    code, out, err = run(capsys, script, "--steps", 1)
    assert code == 0, err
    assert "step(s)" in out


def test_steps_0_reports_the_models_layers(capsys, write_script, tmp_path):
    report = tmp_path / "r.json"
    code, _out, _ = run(capsys, write_script(GOOD), "--steps", 0, "--json", report)
    assert code == 0
    data = json.loads(report.read_text())
    assert data["steps_run"] == 0 and data["steps"] == []
    assert [(la["name"], la["status"], la["grad_norm"]) for la in data["layers"]] == [
        ("0", None, []),
        ("2", None, []),
    ]


def test_malicious_pickle_is_refused_in_one_line_naming_weights_only(capsys, tmp_path):
    import pickle

    class Payload:
        def __reduce__(self):
            return (print, ("this ran",))

    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"weight": Payload()}, protocol=2))
    code, out, err = run(capsys, "squeezenet1_1", "--weights", path, "--steps", 1)
    assert_clean_error(code, err, "weights_only", str(path))
    assert len(err.strip().splitlines()) == 1, err
    assert "this ran" not in out


def _run_subprocess(args, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "gradscope", *map(str, args)], env=env, text=True, **kwargs
    )


def test_ctrl_c_while_build_model_hangs_prints_one_line(write_script, tmp_path):
    marker = tmp_path / "building"
    path = write_script(
        "import time\nfrom pathlib import Path\n"
        f"def build_model():\n    Path({str(marker)!r}).touch()\n    while True:\n"
        "        time.sleep(0.05)\n"
        "def make_batch(batch_size, device):\n    pass\n"
    )
    process = _run_subprocess(["run", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), process.communicate(timeout=10)
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    assert err.strip().splitlines() == ["gradscope: interrupted"], err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    fifo = tmp_path / "pipe.gsrec"
    os.mkfifo(fifo)
    # In-process with a watchdog: a blocked open() is released by opening the other end.
    timer = threading.Timer(20, lambda: open(fifo, "w").close())
    timer.start()
    try:
        code = main(["report", str(fifo)])
    finally:
        timer.cancel()
    _, err = capsys.readouterr()
    assert_clean_error(code, err, str(fifo), "not a regular file")
    script = tmp_path / "model.py"
    os.mkfifo(script)
    weights = tmp_path / "weights.pt"
    os.mkfifo(weights)
    for argv, needle in (
        ([script], "not a regular file"),
        (["resnet18", "--weights", weights], "not a regular file of weights"),
    ):
        timer = threading.Timer(20, lambda path=argv[-1]: open(path, "w").close())
        timer.start()
        try:
            code = main(["run", *map(str, argv)])
        finally:
            timer.cancel()
        _, err = capsys.readouterr()
        assert_clean_error(code, err, needle)


def test_output_cut_short_by_the_reader_is_no_error(write_script, tmp_path):
    report = tmp_path / "r.json"
    process = _run_subprocess(
        ["run", write_script(GOOD), "--steps", 2, "--json", report],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # `| head` that has read enough: every write gets EPIPE
    err = process.stderr.read()
    process.wait(timeout=120)
    assert process.returncode == 0, err
    assert "BrokenPipe" not in err and "Traceback" not in err and "Exception" not in err
    assert json.loads(report.read_text())["steps_run"] == 2  # the rest of the work was done


def test_a_failing_explanation_loses_nothing(capsys, write_script, tmp_path, monkeypatch):
    import gradscope.core.diagnosis

    def broken(origin):
        raise RuntimeError("a bug in the explanation")

    monkeypatch.setattr(gradscope.core.diagnosis, "explain", broken)
    report = tmp_path / "r.json"
    code, out, err = run(capsys, write_script(NAN), "--steps", 3, "--json", report)
    assert code == 0
    assert "first non-finite value: step 0: first NAN in forward" in out
    assert "explaining the origin failed" in err and "please report" in err
    assert json.loads(report.read_text())["first_nonfinite"]["op"] == "torch.log"


def test_out_of_memory_in_the_forward_keeps_the_finished_steps(capsys, write_script, tmp_path):
    grows = GOOD.replace(
        "def build_model():\n    return nn.Sequential(nn.Linear(10, 50), nn.ReLU(), "
        "nn.Linear(50, 1))",
        "class Grows(nn.Module):\n"
        "    calls = 0\n"
        "    def forward(self, x):\n"
        "        Grows.calls += 1\n"
        "        if Grows.calls == 3:\n"
        "            return x * torch.ones(10**13, 1, device=x.device)[: len(x)]\n"
        "        return x\n"
        "def build_model():\n"
        "    return nn.Sequential(nn.Linear(10, 50), Grows(), nn.Linear(50, 1))",
    )
    assert "Grows()" in grows
    report = tmp_path / "r.json"
    code, _out, err = run(capsys, write_script(grows), "--steps", 5, "--json", report)
    assert code == 2
    assert err.startswith("gradscope: error: the forward pass ran out of cpu memory")
    assert "tried to allocate 36.4 TiB" in err and "at batch size 8" in err
    assert_user_frames_only(err)
    data = json.loads(report.read_text())
    assert data["steps"] == [0, 1] and data["error"]["step"] == 2
