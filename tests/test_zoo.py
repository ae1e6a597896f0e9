"""Models by name, with the real libraries: hf:<model_type>, hf:<folder>, timm:<name>.
The extras are part of the test install (make test): a missing one fails, never skips."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import timm  # noqa: F401
import torch
import transformers

from gradscope.cli import main
from gradscope.core.errors import GradScopeError
from gradscope.core.runner import StepRunner
from gradscope.core.sources import load_with_settings

REPO = Path(__file__).resolve().parents[1]

# A BERT of a few thousand parameters: --config values for hf:bert.
TINY_BERT = [
    "num_hidden_layers=1",
    "hidden_size=16",
    "num_attention_heads=2",
    "intermediate_size=32",
    "vocab_size=50",
    "max_position_embeddings=32",
]


def _run(argv, tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(["run", *argv, "--json", str(out)])
    captured = capsys.readouterr()
    return code, (json.loads(out.read_text()) if out.exists() else None), captured


def test_hf_gpt2_keeps_its_real_size_and_trains_on_its_own_loss(tmp_path, capsys):
    # The real 124M GPT-2 (not scaled down), at the default batch of 8 x 128 tokens: the
    # slowest test of the suite, 20-35 s on a 2-core machine.
    code, report, captured = _run(["hf:gpt2", "--steps", "1"], tmp_path, capsys)
    assert code == 0, captured.err
    assert report["steps_run"] == 1
    # A randomly initialised LM predicts uniformly: its loss is about ln(vocabulary).
    assert report["loss"][0] == pytest.approx(math.log(50257), abs=0.5)
    loaded, _ = load_with_settings("hf:gpt2", {})
    assert loaded.architecture["parameters"] == pytest.approx(124.4e6, rel=0.01)
    assert loaded.notes == []
    names = [layer["name"] for layer in report["layers"]]
    assert "transformer.h.11.attn.c_attn" in names
    assert "scaled down" not in captured.err
    assert all(math.isfinite(layer["grad_norm"][0]) for layer in report["layers"])


def test_hf_llama_default_config_is_scaled_down_and_overrides_win():
    loaded, settings = load_with_settings(
        "hf:llama",
        {"model_config": ["num_hidden_layers=2"], "seq_len": 8, "batch_size": 1, "steps": 1},
    )
    scaled = loaded.architecture
    assert scaled["num_hidden_layers"] == 2  # the user's value, not the scaled default's 4
    assert scaled["hidden_size"] == 512 and scaled["num_attention_heads"] == 4
    assert scaled["parameters"] < 150e6
    assert scaled["seq_len"] == 8
    assert any("M parameters, scaled down to" in note for note in loaded.notes)
    assert "num_hidden_layers" not in loaded.notes[0]  # not scaled: the user set it
    runner = StepRunner(loaded, settings)
    try:
        assert len(runner.model.model.layers) == 2
        result = runner.step()
        assert result.loss == pytest.approx(math.log(32000), abs=0.5)
    finally:
        runner.close()


def test_hf_bert_is_a_masked_lm_fed_token_batches(tmp_path, capsys):
    argv = ["hf:bert", "--steps", "2", "--batch-size", "2", "--seq-len", "1000"]
    for item in TINY_BERT:
        argv += ["--config", item]
    code, report, captured = _run(argv, tmp_path, capsys)
    assert code == 0, captured.err
    assert "masked LM" in captured.out
    # --seq-len beyond the model's positions is cut to them, and said so.
    assert "at most 32 positions" in captured.err
    assert report["loss"][0] == pytest.approx(math.log(50), abs=0.5)


def test_hf_local_folder_with_config_only(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    config = {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 16,
        "n_head": 2,
        "n_positions": 64,
        "vocab_size": 40,
    }
    (folder / "config.json").write_text(json.dumps(config))
    code, report, captured = _run(
        [f"hf:{folder}", "--steps", "2", "--batch-size", "2"], tmp_path, capsys
    )
    assert code == 0, captured.err
    assert "holds no weights" in captured.err
    assert report["steps_run"] == 2
    assert [layer["name"] for layer in report["layers"]][:2] == [
        "transformer.wte",
        "transformer.wpe",
    ]
    assert report["loss"][0] == pytest.approx(math.log(40), abs=0.5)
    # --seq-len defaults to 128, cut to the model's 64 positions.
    assert "at most 64 positions" in captured.err
    # A bare name is the model type even beside a folder of that name; ./name is the folder.
    monkeypatch.chdir(tmp_path)
    assert load_with_settings("hf:gpt2")[0].architecture["parameters"] > 100e6
    assert load_with_settings("hf:./gpt2")[0].display_name == "transformers gpt2 (causal LM)"
    assert (
        load_with_settings("hf:./gpt2")[0].notes[0].endswith("the model starts from random weights")
    )


def test_hf_local_folder_loads_its_weights_and_its_head(tmp_path):
    config = transformers.BertConfig(
        num_hidden_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=50,
        max_position_embeddings=32,
        num_labels=3,
    )
    torch.manual_seed(1)
    saved = transformers.BertForSequenceClassification(config)
    saved.save_pretrained(tmp_path / "clf")
    assert (tmp_path / "clf" / "model.safetensors").exists()
    loaded, settings = load_with_settings(
        f"hf:{tmp_path / 'clf'}", {"batch_size": 4, "seq_len": 16, "steps": 1}
    )
    assert "sequence classifier" in loaded.display_name
    runner = StepRunner(loaded, settings)
    try:
        assert isinstance(runner.model, transformers.BertForSequenceClassification)
        for (name, value), (_, expected) in zip(
            runner.model.state_dict().items(), saved.state_dict().items(), strict=True
        ):
            assert torch.equal(value, expected), name
        inputs, labels = loaded.make_batch(4, torch.device("cpu"))
        assert labels.shape == (4,) and int(labels.max()) < 3
        assert inputs["input_ids"].shape == (4, 16)
        result = runner.step()
        assert result.loss == pytest.approx(math.log(3), abs=0.5)
    finally:
        runner.close()


def test_timm_resnet18_at_its_own_input_size(tmp_path, capsys):
    code, report, captured = _run(
        ["timm:resnet18", "--steps", "1", "--batch-size", "2"], tmp_path, capsys
    )
    assert code == 0, captured.err
    assert "timm resnet18" in captured.out
    names = [layer["name"] for layer in report["layers"]]
    assert names[0] == "conv1" and names[-1] == "fc"
    assert report["loss"][0] == pytest.approx(math.log(1000), abs=1.5)
    loaded, settings = load_with_settings("timm:resnet18", {})
    assert settings.image_size == 224  # timm's own, shown in the settings
    images, labels = loaded.make_batch(2, torch.device("cpu"))
    assert images.shape == (2, 3, 224, 224) and labels.shape == (2,)


def test_timm_image_size_as_for_torchvision():
    loaded, settings = load_with_settings("timm:resnet18", {"image_size": 64})
    assert settings.image_size == 64
    assert loaded.make_batch(1, torch.device("cpu"))[0].shape == (1, 3, 64, 64)
    # A ViT's patch grid fixes its size: the request is overruled, and said so.
    loaded, settings = load_with_settings("timm:vit_tiny_patch16_224", {"image_size": 64})
    assert settings.image_size == 224
    assert any("needs 224x224" in note for note in loaded.notes)
    # --config reaches timm.create_model.
    loaded, _ = load_with_settings("timm:resnet18", {"model_config": ["num_classes=7"]})
    model = loaded.build_model()
    assert model.fc.out_features == 7
    assert int(loaded.make_batch(64, torch.device("cpu"))[1].max()) < 7


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("hf:llma", "did you mean llama"),
        ("timm:resnet181", "did you mean resnet18"),
        ("hf:./no/such/folder", "no such folder"),
        ("hf:", "give a name after hf:"),
    ],
)
def test_unknown_names_get_suggestions(source, expected, capsys):
    assert main(["run", source, "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "Traceback" not in err


def test_zoo_model_names_for_a_picker():
    from gradscope.core.zoo import zoo_model_names

    hf = zoo_model_names("hf:")
    assert {"hf:gpt2", "hf:bert", "hf:llama", "hf:t5", "hf:vit"} <= set(hf)
    assert "hf:clip_text_model" not in hf  # no head that random batches can train
    assert "timm:resnet18" in zoo_model_names("timm:")


def test_unknown_config_key_is_an_error_with_suggestions(capsys):
    assert main(["run", "hf:bert", "--config", "num_hiden_layers=1"]) == 2
    err = capsys.readouterr().err
    assert "--config num_hiden_layers" in err and "did you mean num_hidden_layers" in err
    with pytest.raises(GradScopeError, match="key=value"):
        load_with_settings("hf:bert", {"model_config": ["num_hidden_layers"]})


def test_config_overrides_are_refused_where_they_would_be_ignored(capsys):
    script = str(REPO / "sample_models" / "seed_explosion.py")
    for source in ("resnet18", script):
        assert main(["run", source, "--steps", "1", "--config", "num_classes=3"]) == 2
        assert "--config applies to hf: and timm: models only" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "module", "extra"),
    [("hf:gpt2", "transformers", "hf"), ("timm:resnet18", "timm", "timm")],
)
def test_a_missing_extra_is_one_line_naming_the_pip_command(source, module, extra):
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None  # as if it were not installed\n"
        "from gradscope.cli import main\n"
        f"sys.exit(main(['run', {source!r}, '--steps', '1']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"gradscope: error: {module} is not installed; install it with: "
        f'pip install "gradscope[{extra}]"'
    ]
