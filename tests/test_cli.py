"""``gradscope run``: summary, strict JSON, exit codes, and one clear message per bad input
with no GradScope traceback."""

import json
import subprocess
import sys
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
    assert "epsilon" in data["first_nonfinite"]["hint"]
    assert data["first_nonfinite"]["values"]["inputs"][0]["max"] == 0.0
    layers = {layer["name"]: layer for layer in data["layers"]}
    assert layers["3"]["status"] == "nonfinite"
    assert layers["3"]["grad_norm"] == ["nan"]
    keys = {"source", "device", "steps_run", "loss", "first_nonfinite", "run_events", "layers"}
    assert set(data) == keys


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
    path = write_script(GOOD)
    for command in (
        [sys.executable, "-m", "gradscope", "run", str(path), "--steps", "2"],
        [str(REPO / ".venv" / "bin" / "gradscope"), "run", str(path), "--steps", "2"],
    ):
        if not (command[0] == sys.executable or (REPO / ".venv" / "bin" / "gradscope").exists()):
            continue
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "layer" in result.stdout and "status" in result.stdout


def test_torchvision_state_dict_is_loaded_weights_only(capsys, tmp_path):
    import torchvision

    from gradscope.core.loading import load_source

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
