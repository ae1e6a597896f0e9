"""Input blame: NaN/Inf in the batch, or in the arguments the model was called with.

The batch's tensors are named by their path (``inputs``, ``target``, ``inputs['mask']``);
NaN in them is the data's fault, and an Inf that is not a mask (``-inf`` among values
``<= 0``) is too when the re-run shows it flowing into the first bad value.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gradscope.core.facts import SAMPLES_SHOWN, Origin
from gradscope.core.origin.kinds import tensor_summary


# -- the batch ---------------------------------------------------------------------------
@dataclass
class _BadTensor:
    """A batch tensor that holds NaN or Inf."""

    path: str
    tensor: torch.Tensor
    nan: int
    inf: int
    by_design: bool  # only -inf among values <= 0: an additive mask or log-probabilities


def _key(key: Any) -> str:
    return json.dumps(key) if isinstance(key, str) else repr(key)


def _paths(tree: Any, path: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        yield path, tree
        return
    if depth > 24:
        return
    if isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from _paths(value, f"{path}[{index}]", depth + 1)
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _paths(value, f"{path}[{_key(key)}]", depth + 1)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for item in dataclasses.fields(tree):
            yield from _paths(getattr(tree, item.name, None), f"{path}.{item.name}", depth + 1)


def _named_batch(batch: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors of a batch with their paths; a pair is ``(inputs, target)`` by convention."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and not hasattr(batch, "_fields"):
        yield from _paths(batch[0], "inputs")
        yield from _paths(batch[1], "target")
    else:
        yield from _paths(batch, "batch")


def _named_call(args: tuple, kwargs: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's call arguments named as the batch's inputs (``model(x)``: ``inputs``;
    ``model(*inputs)``: ``inputs[i]``; ``model(**inputs)``: ``inputs['name']``)."""
    if len(args) == 1 and not kwargs:
        yield from _paths(args[0], "inputs")
        return
    for index, value in enumerate(args):
        yield from _paths(value, f"inputs[{index}]")
    for key, value in kwargs.items():
        yield from _paths(value, f"inputs[{_key(key)}]")


def _bad_tensors(named: Iterator[tuple[str, torch.Tensor]]) -> list[_BadTensor]:
    bad = []
    for path, tensor in named:
        if not (tensor.is_floating_point() or tensor.is_complex()) or not tensor.numel():
            continue
        data = tensor.detach()
        if bool(torch.isfinite(data).all()):
            continue
        nan = int(torch.isnan(data).sum())
        inf = int(torch.isinf(data).sum())
        by_design = False
        if not nan and not data.is_complex():
            finite = data[torch.isfinite(data)]
            by_design = not bool((data == math.inf).any()) and (
                not finite.numel() or float(finite.max()) <= 0.0
            )
        bad.append(_BadTensor(path, data, nan, inf, by_design))
    return bad


def _input_origin(step: int, bad: list[_BadTensor], kind: str, source: str) -> Origin:
    chosen = [b for b in bad if (b.nan if kind == "nan" else b.inf)]
    first = chosen[0]
    data = first.tensor
    wrong = torch.isnan(data) if kind == "nan" else torch.isinf(data)
    positions = torch.nonzero(wrong)
    samples: list[int] = []
    if data.dim():
        samples = torch.unique(positions[:, 0]).tolist()[:20]
    origin = Origin(step, "input", None, first.path, kind)
    shown = positions[:SAMPLES_SHOWN].tolist()
    # the values of the batch tensors at fault; the first also says where (these reach the
    # JSON report, which writes an origin's values)
    values = [{"path": b.path, **tensor_summary(b.tensor)} for b in chosen[:4]]
    values[0].update(positions=shown, samples=samples)
    origin.details.update(
        source=source,
        count=first.nan if kind == "nan" else first.inf,
        positions=shown,
        samples=samples,
        tensors=[
            {"path": b.path, "nan": b.nan, "inf": b.inf, "mask_like": b.by_design} for b in bad
        ],
        values={"batch": values},
    )
    from gradscope.core.diagnosis import hint_for

    origin.details["hint"] = hint_for(origin)
    return origin


def _blame_input(
    step: int, bad: list[_BadTensor], found: Origin | None, source: str
) -> Origin | None:
    """The batch's fault, or None when the model's own origin stands. NaN in the data is,
    unless the model handled it (``nan_to_num``, ``torch.where``) and then made a NaN/Inf of
    its own in forward or loss from values free of it; an Inf that looks like a mask (only
    -inf, among values <= 0) never is; any other Inf is when the model's first bad value
    only carried what came in: the loss merely propagated it, or a NaN was made from inputs
    that already held Inf."""
    if not bad:
        return None
    if any(b.nan for b in bad):
        if (
            found is not None
            and found.phase in ("forward", "loss")
            and not (
                found.details.get("propagated") or (found.phase == "loss" and found.op is None)
            )
        ):
            return None  # made by the model from NaN-free values
        origin = _input_origin(step, bad, "nan", source)
        if found is not None:
            origin.details["model_origin"] = found.describe()
        return origin
    suspects = [b for b in bad if b.inf and not b.by_design]
    if not suspects or found is None or found.phase not in ("forward", "loss"):
        return None
    if found.kind == "inf" and found.op is not None and not found.details.get("propagated"):
        return None  # an Inf the model made from Inf-free inputs
    carried_inf = found.op is None or found.details.get("propagated")
    for key in ("values", "module_values"):
        stats = (found.details.get(key) or {}).get("inputs") or []
        carried_inf = carried_inf or any(s.get("inf") for s in stats)
    if not carried_inf:
        return None
    origin = _input_origin(step, suspects, "inf", source)
    origin.details["model_origin"] = found.describe()
    return origin
