"""Models by name from the libraries people train with: ``hf:<model_type>``,
``hf:<folder with config.json>`` (transformers) and ``timm:<name>`` (timm).

Everything is built offline with random weights (a local folder's own weights excepted):
transformers from its default config for the model type, timm with ``pretrained=False``.
Batches are random but fit the model: token ids and labels for language models and text
classifiers, images of the model's own input size for vision models. The loss is the one
the model computes itself (``output.loss``).

transformers and timm are optional extras, imported here only when such a source is asked
for; a missing one is one clear line naming the pip command.
"""

from __future__ import annotations

import difflib
import importlib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradscope.core.errors import GradScopeError
from gradscope.core.loading import (
    LoadedModel,
    _load_state_dict,
    load_weights,
    random_images,
)

ZOO_PREFIXES = ("hf:", "timm:")
DEFAULT_SEQ_LEN = 128

# Default configs with more parameters than this are scaled down; GPT-2 small (124M) and
# BERT base (110M) keep their real size. Scaled models land around 20-60M parameters, which
# step in a few seconds on a laptop CPU.
_KEEP_REAL_SIZE = 150_000_000
_SCALED_LAYERS = 4
_SCALED_WIDTH = 512
_SCALED_EXPERTS = 4
_SCALED_VOCABULARY = 32_768

# Config attributes (transformers' common names; ``attribute_map`` translates them for
# GPT-2-style configs) that scaling touches.
_LAYER_KEYS = ("num_hidden_layers", "encoder_layers", "decoder_layers", "num_decoder_layers")
_HEAD_KEYS = ("num_attention_heads", "encoder_attention_heads", "decoder_attention_heads")
_FFN_KEYS = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "d_ff",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def is_zoo_source(source: str) -> bool:
    return source.startswith(ZOO_PREFIXES)


def require(module: str, extra: str) -> Any:
    """Import an optional library, or fail with the one line that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        command = f'pip install "gradscope[{extra}]"'
        if getattr(error, "name", None) == module:
            raise GradScopeError(f"{module} is not installed; install it with: {command}") from None
        # Installed, but one of its own imports fails (a broken or mismatched install).
        raise GradScopeError(
            f"{module} cannot be imported ({error}); reinstall: {command}"
        ) from None


def load_zoo_model(
    source: str, *, weights: str | None = None, options: Mapping[str, Any] | None = None
) -> LoadedModel:
    """``options``: the run settings the user gave (``image_size``, ``seq_len``,
    ``model_config``); an ``image_size`` missing from them means the model's own."""
    options = dict(options or {})
    prefix, _, name = source.partition(":")
    if not name:
        raise GradScopeError(
            f"{source!r}: give a name after {prefix}: (e.g. hf:gpt2, timm:resnet18)"
        )
    overrides = parse_model_config(options.get("model_config"))
    if prefix == "hf":
        if weights:
            raise GradScopeError(
                "--weights is for torchvision and timm models; for transformers, give a folder "
                "holding config.json and its weights: hf:path/to/folder"
            )
        return _load_hf(source, name, overrides, options.get("seq_len") or DEFAULT_SEQ_LEN)
    return _load_timm(source, name, overrides, options.get("image_size"), weights)


def zoo_model_names(prefix: str) -> list[str]:
    """Every name ``prefix`` ("hf:" or "timm:") takes, for a picker such as the app's
    (transformers: the model types with a head that random batches can train)."""
    if prefix == "hf:":
        require("transformers", "hf")
        from transformers.models.auto import modeling_auto

        types = set()
        for _, mapping, _ in _hf_tasks():
            types.update(getattr(modeling_auto, mapping, {}))
        return [f"hf:{name}" for name in sorted(types)]
    if prefix == "timm:":
        return [f"timm:{name}" for name in require("timm", "timm").list_models()]
    raise GradScopeError(f"unknown model prefix {prefix!r}; use one of {', '.join(ZOO_PREFIXES)}")


def parse_model_config(values: Any) -> dict[str, Any]:
    """``--config key=value`` pairs (or a dict) as a dict; values are read as JSON where
    they parse (``4``, ``0.1``, ``true``, ``null``, ``[1, 2]``), else kept as text."""
    if not values:
        return {}
    if isinstance(values, Mapping):
        items = list(values.items())
    else:
        items = []
        for text in values:
            key, sep, value = str(text).partition("=")
            if not sep or not key.strip():
                raise GradScopeError(f"--config takes key=value, not {text!r}")
            items.append((key.strip(), value.strip()))
    parsed = {}
    for key, value in items:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        parsed[key] = value
    return parsed


def _suggest(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else ""


# -- transformers -------------------------------------------------------------------------
def _hf_tasks() -> list[tuple[str, str, str]]:
    """(task, mapping of model types, Auto class), in the order GradScope prefers: encoders
    such as BERT are in both LM mappings and are trained as masked LMs."""
    return [
        ("masked LM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
        ("causal LM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
        ("seq2seq LM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
        (
            "sequence classifier",
            "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
            "AutoModelForSequenceClassification",
        ),
        (
            "image classifier",
            "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
            "AutoModelForImageClassification",
        ),
    ]


def _hf_task(transformers: Any, config: Any) -> tuple[str, Any]:
    """The task and the class to build: the config's own ``architectures`` (a checkpoint
    folder's config.json names its head) when GradScope can feed it, else by model type."""
    from transformers.models.auto import modeling_auto

    model_type = config.model_type
    for architecture in getattr(config, "architectures", None) or []:
        for task, mapping, _ in _hf_tasks():
            names = getattr(modeling_auto, mapping, {}).get(model_type)
            names = names if isinstance(names, (list, tuple)) else [names]
            if architecture in names and hasattr(transformers, architecture):
                return task, getattr(transformers, architecture)
    for task, mapping, auto_class in _hf_tasks():
        if model_type in getattr(modeling_auto, mapping, {}):
            return task, getattr(transformers, auto_class)
    kinds = ", ".join(task for task, _, _ in _hf_tasks())
    raise GradScopeError(
        f"hf:{model_type} has no head GradScope can train with random batches ({kinds}); "
        "for other models write a model script (build_model, make_batch, loss_fn)"
    )


def _looks_like_folder(name: str, model_types: Mapping[str, Any]) -> bool:
    """A path by its look; a bare name is a model type even if a folder has that name."""
    if "/" in name or "\\" in name or name.startswith((".", "~")):
        return True
    return name not in model_types and Path(name).is_dir()


def _hf_weights(folder: Path) -> Path | None:
    for file in ("model.safetensors", "model.safetensors.index.json"):
        if (folder / file).exists():
            return folder / file
    for file in ("pytorch_model.bin", "pytorch_model.bin.index.json"):
        if (folder / file).exists():
            return folder / file
    return None


def _hf_config(transformers: Any, name: str) -> tuple[Any, Path | None, Path | None]:
    """(config, folder, weights file) for ``hf:<model_type>`` or ``hf:<folder>``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if _looks_like_folder(name, CONFIG_MAPPING_NAMES):
        folder = Path(name).expanduser()
        if not folder.is_dir():
            raise GradScopeError(f"hf:{name}: no such folder")
        if not (folder / "config.json").is_file():
            raise GradScopeError(f"hf:{name}: the folder has no config.json")
        try:
            config = transformers.AutoConfig.from_pretrained(
                str(folder), local_files_only=True, trust_remote_code=False
            )
        except Exception as error:  # a malformed config.json or unknown model_type
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise GradScopeError(
                f"hf:{name}: config.json cannot be read: {type(error).__name__}: {first}"
            ) from None
        return config, folder, _hf_weights(folder)
    names = sorted(CONFIG_MAPPING_NAMES)
    if name not in CONFIG_MAPPING_NAMES:
        raise GradScopeError(
            f"hf:{name}: not a transformers model type (nor a folder with config.json)"
            f"{_suggest(name, names)}"
        )
    return transformers.AutoConfig.for_model(name), None, None


def _apply_config(config: Any, overrides: Mapping[str, Any], what: str) -> None:
    known = sorted(set(config.to_dict()) | set(getattr(config, "attribute_map", {})))
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise GradScopeError(
                f"--config {key}: {what} has no such setting{_suggest(key, known)}"
            )
        setattr(config, key, value)


def _count_parameters(auto_class: Any, config: Any) -> int | None:
    """The model's parameter count, built on the meta device (no memory, no init time)."""
    try:
        with torch.device("meta"):
            model = auto_class.from_config(config)
        return sum(p.numel() for p in model.parameters())
    except Exception:
        return None


def _scale_down(config: Any, fixed: set[str]) -> dict[str, tuple[Any, Any]]:
    """Shrink depth, width and experts of a default config in place, keeping the head
    size and the ratio of attention to key/value heads; keys the user set are left alone.
    Returns {key: (default, scaled)}."""
    changes: dict[str, tuple[Any, Any]] = {}

    def shrink(key: str, value: int) -> None:
        if key in fixed or not hasattr(config, key):
            return
        old = getattr(config, key)
        if isinstance(old, int) and not isinstance(old, bool) and 0 < value < old:
            setattr(config, key, value)
            changes[key] = (old, value)

    old_layers = getattr(config, "num_hidden_layers", None)
    for key in _LAYER_KEYS:
        shrink(key, _SCALED_LAYERS)
    new_layers = getattr(config, "num_hidden_layers", None)
    if isinstance(old_layers, int) and new_layers != old_layers:
        # Per-layer lists (layer_types, sliding-window flags...) follow the layer count.
        for key, value in list(vars(config).items()):
            if isinstance(value, list) and len(value) == old_layers and key not in fixed:
                setattr(config, key, value[:new_layers])
                changes[key] = (f"{old_layers} entries", f"{new_layers} entries")

    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    if isinstance(hidden, int) and hidden > _SCALED_WIDTH and "hidden_size" not in fixed:
        explicit_head_dim = getattr(config, "head_dim", None)
        head_dim = explicit_head_dim or (
            hidden // heads if isinstance(heads, int) and heads else 64
        )
        new_heads = max(1, _SCALED_WIDTH // head_dim)
        new_hidden = _SCALED_WIDTH if explicit_head_dim else new_heads * head_dim
        factor = new_hidden / hidden
        kv_heads = getattr(config, "num_key_value_heads", None)
        shrink("hidden_size", new_hidden)
        for key in _HEAD_KEYS:
            shrink(key, new_heads)
        if isinstance(kv_heads, int) and isinstance(heads, int) and kv_heads > 0:
            shrink("num_key_value_heads", max(1, new_heads * kv_heads // heads))
        for key in _FFN_KEYS:
            old = getattr(config, key, None)
            if isinstance(old, int) and old > 0:
                shrink(key, max(64, math.ceil(old * factor / 64) * 64))
    for key in _EXPERT_KEYS:
        shrink(key, _SCALED_EXPERTS)
    for key in ("num_experts_per_tok", "top_k", "moe_topk"):
        shrink(key, 2)
    if any(key in changes for key in _EXPERT_KEYS):
        # Grouped routing (DeepSeek) splits the experts into n_group groups.
        for key in ("n_group", "topk_group"):
            shrink(key, 1)
    return changes


def _scale_vocabulary(config: Any, fixed: set[str]) -> dict[str, tuple[Any, Any]]:
    """A vocabulary of 150k+ tokens is most of a scaled model (embedding and head): cut it
    to 32k, above every special token id the config names."""
    vocab = getattr(config, "vocab_size", None)
    if "vocab_size" in fixed or not isinstance(vocab, int) or vocab <= _SCALED_VOCABULARY:
        return {}
    special = [0]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(config, key, None)
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token, int):
                special.append(token)
    new = max(_SCALED_VOCABULARY, max(special) + 1)
    if new >= vocab:
        return {}
    config.vocab_size = new
    return {"vocab_size": (vocab, new)}


def _max_positions(config: Any) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _loss_from_output(output: Any, target: Any) -> torch.Tensor:
    """The loss the model computed itself (transformers' ``output.loss``)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if loss is None:
        raise GradScopeError(
            f"the model returned no loss ({type(output).__name__} without .loss); "
            "were the labels passed?"
        )
    return loss


def _load_hf(source: str, name: str, overrides: dict[str, Any], seq_len: int) -> LoadedModel:
    transformers = require("transformers", "hf")
    config, folder, weights_file = _hf_config(transformers, name)
    what = f"{config.model_type}'s config"
    _apply_config(config, overrides, what)
    task, auto_class = _hf_task(transformers, config)
    notes: list[str] = []
    named = list(getattr(config, "architectures", None) or [])
    if named and auto_class.__name__ not in named:
        notes.append(
            f"config.json names {', '.join(named)}, which random batches cannot train; "
            f"training it as a {task} ({auto_class.__name__})"
        )
    if task == "sequence classifier" and getattr(config, "pad_token_id", None) is None:
        # Decoder classifiers pool the last non-padding token and refuse batches > 1
        # without a padding id.
        config.pad_token_id = 0
    if task == "seq2seq LM" and getattr(config, "decoder_start_token_id", None) is None:
        # Seq2seq models build decoder inputs by shifting the labels right from this id
        # (T5's default config leaves it to its checkpoints).
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    changes: dict[str, tuple[Any, Any]] = {}
    count = None
    if folder is None:
        count = _count_parameters(auto_class, config)
        if count is not None and count > _KEEP_REAL_SIZE:
            changes = _scale_down(config, set(overrides))
            scaled = _count_parameters(auto_class, config)
            if scaled is not None and scaled > _KEEP_REAL_SIZE:
                changes.update(_scale_vocabulary(config, set(overrides)))
                scaled = _count_parameters(auto_class, config)
            listed = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changes.items())
            notes.append(
                f"hf:{name}'s default config has {count / 1e6:,.0f}M parameters, scaled down "
                f"to {(scaled or 0) / 1e6:,.0f}M so it steps on a CPU ({listed}); "
                "--config key=value sets any of them"
            )
            count = scaled
    elif weights_file is None:
        notes.append(f"{folder} holds no weights; the model starts from random weights")

    max_positions = _max_positions(config)
    length = seq_len
    if max_positions is not None and seq_len > max_positions:
        length = max_positions
        notes.append(f"hf:{name} takes at most {max_positions} positions; sequences of {length}")
    architecture = {
        "task": task,
        "model_type": config.model_type,
        **{
            k: getattr(config, k)
            for k in ("num_hidden_layers", "hidden_size")
            if hasattr(config, k)
        },
        **{k: new for k, (_, new) in changes.items()},
        **overrides,
    }
    if count is not None:
        architecture["parameters"] = count
    if task == "image classifier":
        size = int(_first(getattr(config, "image_size", 224)))
        architecture["image_size"] = size
    else:
        architecture["seq_len"] = length

    def build_model() -> nn.Module:
        if weights_file is None:
            return auto_class.from_config(config)
        try:
            # safetensors first; .bin checkpoints are read by transformers with
            # weights_only=True. No code from the folder is ever run.
            return auto_class.from_pretrained(
                str(folder), config=config, local_files_only=True, trust_remote_code=False
            )
        except Exception as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise GradScopeError(
                f"the weights in {folder} do not load: {type(error).__name__}: {first}"
            ) from None

    make_batch = _hf_batch(config, task, length)
    display = (
        f"transformers {config.model_type}" if folder is None else f"transformers {folder.name}"
    )
    return LoadedModel(
        source=source,
        display_name=f"{display} ({task})",
        build_model=build_model,
        make_batch=make_batch,
        loss_fn=_loss_from_output,
        path=None,
        notes=notes,
        architecture=architecture,
    )


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, (list, tuple)) else value


def _hf_batch(config: Any, task: str, length: int) -> Callable[[int, torch.device], Any]:
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    num_labels = int(getattr(config, "num_labels", 2) or 2)

    def make_batch(batch_size: int, device: torch.device) -> tuple[dict[str, Any], Any]:
        if task == "image classifier":
            size = int(_first(getattr(config, "image_size", 224)))
            channels = int(getattr(config, "num_channels", 3))
            pixels = torch.randn(batch_size, channels, size, size, device=device)
            labels = torch.randint(0, num_labels, (batch_size,), device=device)
            return {"pixel_values": pixels, "labels": labels}, labels
        if vocab <= 0:
            raise GradScopeError(
                f"{config.model_type}'s config has no vocab_size to draw tokens from"
            )
        ids = torch.randint(0, vocab, (batch_size, length), device=device)
        mask = torch.ones_like(ids)
        if task == "sequence classifier":
            labels = torch.randint(0, num_labels, (batch_size,), device=device)
        else:
            # Causal LMs shift the labels themselves; masked and seq2seq LMs predict them.
            labels = ids.clone()
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}, labels

    return make_batch


# -- timm ---------------------------------------------------------------------------------
def _load_timm(
    source: str,
    name: str,
    overrides: dict[str, Any],
    requested_size: int | None,
    weights: str | None,
) -> LoadedModel:
    timm = require("timm", "timm")
    architecture_name = name.split(".")[0]
    if not timm.is_model(architecture_name):
        raise GradScopeError(f"timm:{name}: not a timm model{_suggest(name, timm.list_models())}")
    try:
        pretrained_cfg = timm.models.get_pretrained_cfg(name) or timm.models.get_pretrained_cfg(
            architecture_name
        )
    except Exception:
        pretrained_cfg = None
    input_size = tuple(getattr(pretrained_cfg, "input_size", None) or (3, 224, 224))
    fixed = bool(getattr(pretrained_cfg, "fixed_input_size", False))
    own = int(input_size[-1])
    channels = int(overrides.get("in_chans", input_size[0]))
    num_classes = int(
        overrides.get("num_classes", getattr(pretrained_cfg, "num_classes", 1000) or 1000)
    )
    notes: list[str] = []
    size = own
    if requested_size is not None and requested_size != own:
        if fixed and "img_size" not in overrides:
            notes.append(f"timm:{name} needs {own}x{own} images; using that size")
        else:
            size = requested_size
    if "img_size" in overrides:
        size = int(_first(overrides["img_size"]))
    state = _load_state_dict(weights) if weights else None

    def build_model() -> nn.Module:
        try:
            model = timm.create_model(name, pretrained=False, **overrides)
        except TypeError as error:
            raise GradScopeError(f"timm:{name}: --config: {error}") from None
        if state is not None:
            load_weights(model, state, f"{weights} does not fit timm:{name}")
        return model

    return LoadedModel(
        source=source,
        display_name=f"timm {name}",
        build_model=build_model,
        make_batch=random_images(channels, size, num_classes),
        loss_fn=None,
        image_size=size,
        notes=notes,
        architecture={"image_size": size, "num_classes": num_classes, **overrides},
    )
