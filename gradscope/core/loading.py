"""Model sources: a user's model script, or a torchvision classification model by name.

A model script is a Python file defining ``build_model() -> nn.Module`` (required) and
optionally ``make_batch(batch_size, device) -> (inputs, target)``,
``loss_fn(output, target) -> Tensor`` and ``CONFIG = {...}`` (defaults for run settings).
Every way a script can fail becomes a :class:`ModelScriptError` with the script's own
traceback lines, never GradScope's.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import pickle
import sys
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from gradscope.core.errors import GradScopeError, ModelScriptError, out_of_memory

MakeBatch = Callable[[int, torch.device], tuple[Any, Any]]
LossFn = Callable[[Any, Any], torch.Tensor]

# Models whose architecture fixes the input size (positional embeddings, window grids).
_FIXED_SIZE_PREFIXES = ("vit_", "maxvit_", "swin_")
# Models whose training-mode auxiliary head needs the weights' crop size at least
# (inception_v3's AuxLogits: a 5x5 convolution on a 17x17 map, i.e. 299x299 images), while
# the weights' metadata gives the smaller size the main path alone accepts as min_size.
_AT_LEAST_CROP_SIZE = ("inception_v3",)


@dataclass
class LoadedModel:
    """What a run needs from a source: the model factory, batches and the loss."""

    source: str
    display_name: str
    build_model: Callable[[], nn.Module]
    make_batch: MakeBatch
    loss_fn: LossFn | None
    config: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    image_size: int | None = None
    notes: list[str] = field(default_factory=list)
    # hf:/timm: models: the architecture as built (scaled-down sizes included), to show.
    architecture: dict[str, Any] = field(default_factory=dict)


# -- model scripts ------------------------------------------------------------------------
def _script_traceback(error: BaseException, path: Path) -> list[str]:
    """The traceback frames from the user's script onwards (GradScope's frames dropped)."""
    frames = traceback.extract_tb(error.__traceback__)
    resolved = str(path.resolve())
    start = next((i for i, f in enumerate(frames) if os.path.abspath(f.filename) == resolved), 0)
    lines = traceback.format_list(frames[start:])
    lines += traceback.format_exception_only(type(error), error)
    return [line.rstrip("\n") for line in "".join(lines).splitlines()]


def user_traceback(error: BaseException, user_files: list[Path]) -> list[str]:
    """Traceback lines of the user's own code for an error raised while running it
    (build_model, make_batch, forward): frames inside torch and GradScope are left out, and
    the exception line closes the list."""
    frames = traceback.extract_tb(error.__traceback__)
    wanted = {str(p.resolve()) for p in user_files}
    ours = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    kept = [
        f
        for f in frames
        if os.path.abspath(f.filename) in wanted or not f.filename.startswith(ours)
    ]
    lines = traceback.format_list(kept)
    lines += traceback.format_exception_only(type(error), error)
    return [line.rstrip("\n") for line in "".join(lines).splitlines()]


def _import_script(path: Path) -> ModuleType:
    name = f"gradscope_user_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelScriptError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered so dataclasses, pickling and relative lookups inside the script work.
    sys.modules[name] = module
    # The script's folder goes first on sys.path, as `python script.py` puts it, so the
    # script imports the modules next to it wherever GradScope was started. It stays there:
    # build_model or make_batch may import them later, as under `python script.py`.
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        sys.modules.pop(name, None)
        if "null bytes" in str(error.msg):  # Python gives no line for these
            raise ModelScriptError(
                f"{path} is not a Python script: it holds NUL bytes (a binary file, or text "
                "saved as UTF-16?); save it as UTF-8 text"
            ) from None
        where = str(error.filename or path)
        if error.lineno is not None:
            where += f", line {error.lineno}"
        detail = [error.text.rstrip("\n")] if error.text else []
        if detail and error.offset:
            detail.append(" " * (error.offset - 1) + "^")
        raise ModelScriptError(f"syntax error in {where}: {error.msg}", detail) from None
    except BaseException as error:
        sys.modules.pop(name, None)
        if isinstance(error, KeyboardInterrupt):
            raise
        raise ModelScriptError(
            f"{path} raised {type(error).__name__} while loading: {error}",
            _script_traceback(error, path),
        ) from None
    return module


def load_script(source: str | os.PathLike[str]) -> LoadedModel:
    path = Path(source).expanduser()
    if not path.exists():
        raise GradScopeError(f"no such file: {path}")
    if path.is_dir():
        raise GradScopeError(f"{path} is a folder; give a model script (.py)")
    if path.suffix != ".py":
        raise GradScopeError(f"{path} is not a Python model script (.py)")
    if not path.is_file():  # a FIFO or a device: reading it could block for ever
        raise GradScopeError(f"{path} is not a regular file")
    module = _import_script(path)
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise ModelScriptError(
            f"{path} defines no build_model(); add a function `def build_model() -> nn.Module:` "
            "that returns your model"
        )
    make_batch = getattr(module, "make_batch", None)
    if make_batch is None:
        make_batch = _missing_make_batch(path)
    elif not callable(make_batch):
        raise ModelScriptError(f"{path}: make_batch must be a function (batch_size, device)")
    loss_fn = getattr(module, "loss_fn", None)
    if loss_fn is not None and not callable(loss_fn):
        raise ModelScriptError(f"{path}: loss_fn must be a function (output, target)")
    config = getattr(module, "CONFIG", {}) or {}
    if not isinstance(config, dict):
        raise ModelScriptError(f"{path}: CONFIG must be a dict of run settings")
    doc = (module.__doc__ or "").strip()
    return LoadedModel(
        source=str(path),
        display_name=path.name,
        build_model=_guarded(build, path, "build_model()"),
        make_batch=_guarded(make_batch, path, "make_batch()"),
        loss_fn=_guarded(loss_fn, path, "loss_fn()") if loss_fn else None,
        config=dict(config),
        path=path,
        notes=[doc.splitlines()[0]] if doc else [],
    )


def _guarded(function: Callable[..., Any], path: Path, what: str) -> Callable[..., Any]:
    """Wrap a script function so its exceptions carry the script's traceback."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except GradScopeError:
            raise
        except SystemExit as error:
            # Never a silent exit 0: the run did not finish, the script ended it.
            raise ModelScriptError(
                f"{path.name}: {what} called sys.exit({error.code!r}); the run cannot go on",
                user_traceback(error, [path]),
            ) from None
        except Exception as error:
            memory = out_of_memory(error)
            if memory is not None:
                raise GradScopeError(
                    f"{path.name}: {what} ran out of memory ({memory}) with arguments "
                    f"{', '.join(map(str, args))}; lower --batch-size",
                    user_traceback(error, [path])[-3:-1],
                ) from None
            raise ModelScriptError(
                f"{path.name}: {what} raised {type(error).__name__}: {error}",
                user_traceback(error, [path]),
            ) from error
        except BaseException as error:
            if isinstance(error, (KeyboardInterrupt, GeneratorExit)):
                raise
            # A BaseException subclass of the user's (asyncio.CancelledError, a class of
            # their own): their error like any other, not GradScope's.
            raise ModelScriptError(
                f"{path.name}: {what} raised {type(error).__name__}: {error}",
                user_traceback(error, [path]),
            ) from None

    call.__wrapped__ = function  # type: ignore[attr-defined]
    return call


def _missing_make_batch(path: Path) -> MakeBatch:
    def make_batch(batch_size: int, device: torch.device) -> tuple[Any, Any]:
        raise ModelScriptError(
            f"{path} defines no make_batch(); GradScope needs example data to run steps. Add:\n"
            "    def make_batch(batch_size, device):\n"
            "        x = torch.randn(batch_size, <input features>, device=device)\n"
            "        y = torch.randn(batch_size, <outputs>, device=device)\n"
            "        return x, y"
        )

    return make_batch


# -- torchvision --------------------------------------------------------------------------
def torchvision_model_names() -> list[str]:
    """Classification models registered in torchvision (from its registry, not a list)."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def torchvision_input_size(name: str, requested: int) -> tuple[int, list[str]]:
    """The image size to feed ``name``: the request, raised to the model's minimum, or the
    model's fixed size for architectures that allow no other."""
    import torchvision

    notes: list[str] = []
    try:
        weights = torchvision.models.get_model_weights(name).DEFAULT
    except (ValueError, KeyError, AttributeError):
        return requested, notes
    crop_size = _crop_size(weights)
    min_size = weights.meta.get("min_size", (1, 1))
    if name.startswith(_FIXED_SIZE_PREFIXES):
        # Built without weights, the architecture takes its builder's default size: the
        # smallest of its weights' sizes (vit_h_14's DEFAULT, SWAG E2E, rebuilds it for 518;
        # without weights it is the 224 of its other entry).
        crop_size = min(_crop_size(entry) for entry in type(weights))
        if requested != crop_size:
            notes.append(f"{name} needs {crop_size}x{crop_size} images; using that size")
        return crop_size, notes
    size = max(requested, int(min_size[0]), int(min_size[1]))
    if name in _AT_LEAST_CROP_SIZE:
        size = max(size, crop_size)
    if size != requested:
        notes.append(f"{name} needs images of at least {size}x{size}; using that size")
    return size, notes


def _crop_size(weights: Any) -> int:
    crop = weights.transforms().crop_size
    return int(crop[0] if isinstance(crop, (list, tuple)) else crop)


def load_torchvision(name: str, image_size: int = 224, weights: str | None = None) -> LoadedModel:
    names = torchvision_model_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise GradScopeError(
            f"{name!r} is neither a .py model script nor a torchvision classification model{hint}"
        )
    size, notes = torchvision_input_size(name, image_size)
    state = _load_state_dict(weights) if weights else None

    def build_model() -> nn.Module:
        import torchvision

        model = torchvision.models.get_model(name, weights=None)
        if state is not None:
            load_weights(model, state, f"{weights} does not fit {name}")
        return model

    return LoadedModel(
        source=name,
        display_name=f"torchvision {name}",
        build_model=build_model,
        make_batch=random_images(3, size, 1000),
        loss_fn=None,
        image_size=size,
        notes=notes,
    )


def random_images(channels: int, size: int, classes: int) -> MakeBatch:
    """``make_batch`` for an image classifier: random images and random labels."""

    def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.randn(batch_size, channels, size, size, device=device)
        labels = torch.randint(0, classes, (batch_size,), device=device)
        return images, labels

    return make_batch


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], misfit: str) -> None:
    """``model.load_state_dict(state)``; a state dict that does not fit the model is one
    clear error (``misfit``: what to say first) with the first lines of torch's reasons."""
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        lines = str(error).splitlines()
        raise GradScopeError(f"{misfit}: {lines[0]}", lines[1:6]) from None


def _load_state_dict(path_text: str) -> dict[str, torch.Tensor]:
    path = Path(path_text).expanduser()
    if not path.exists():
        raise GradScopeError(f"no such weights file: {path}")
    if not path.is_file():  # a folder, a FIFO or a device
        raise GradScopeError(f"{path} is not a regular file of weights")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message says "Unsupported global" for a class it will not unpickle; for
        # bytes that are no pickle at all it names an opcode ("Unsupported operand 249").
        if "global" not in str(error).lower():
            raise GradScopeError(
                f"{path} is not a PyTorch weights file (one torch.save wrote): "
                f"{_unpickler_reason(error)}"
            ) from None
        raise GradScopeError(
            f"{path} holds Python objects beyond tensors, which loading with "
            "weights_only=True refuses (unpickling them could run any code); save only the "
            "state dict: torch.save(model.state_dict(), path)"
        ) from None
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise GradScopeError(
            f"{path} is not a loadable state dict: {type(error).__name__}: {first}"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise GradScopeError(f"{path} holds a {type(state).__name__}, not a state dict")
    return state


def _unpickler_reason(error: BaseException) -> str:
    """The line of torch's long weights_only message that says what it met."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    found = next((i for i, line in enumerate(lines) if "WeightsUnpickler error" in line), None)
    if found is None:
        return lines[0] if lines else type(error).__name__
    detail = lines[found].split("WeightsUnpickler error:", 1)[1].strip()
    if not detail and found + 1 < len(lines):
        detail = lines[found + 1]
    return detail or "its contents are not a pickle"
