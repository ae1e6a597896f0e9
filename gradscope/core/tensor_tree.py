"""The tensors in whatever a model takes or returns (tuples, lists, dicts, dataclasses,
``ModelOutput``, anything registered with torch's pytree), and the loss in a step's output.
Used by the watch, the capture, the trace and the origin alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_flatten


def _tensor_leaves(tree: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in tuples, lists, dicts (``ModelOutput`` included), dataclasses and anything
    registered with torch's pytree."""
    if isinstance(tree, torch.Tensor):
        yield tree
        return
    if depth > 24 or tree is None or isinstance(tree, (str, bytes, int, float, bool)):
        return
    if isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensor_leaves(value, depth + 1)
    elif isinstance(tree, Mapping):
        for value in tree.values():
            yield from _tensor_leaves(value, depth + 1)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for item in dataclasses.fields(tree):
            yield from _tensor_leaves(getattr(tree, item.name, None), depth + 1)
    else:
        leaves, _ = tree_flatten(tree)
        if not (len(leaves) == 1 and leaves[0] is tree):
            for value in leaves:
                yield from _tensor_leaves(value, depth + 1)


def float_tensors(tree: Any) -> list[torch.Tensor]:
    """The floating-point tensors anywhere in ``tree`` (tuples, lists, dicts, named tuples,
    dataclasses, ``ModelOutput``-like objects)."""
    return [t for t in _tensor_leaves(tree) if t.is_floating_point()]


def loss_from_output(value: Any) -> torch.Tensor:
    """The loss in what a step computed: a tensor as it is; from a dict, a dataclass or a
    ``ModelOutput``-like object (a model that computes its loss inside ``forward``), its
    ``loss``. Raises ``TypeError`` with a readable message otherwise."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        loss = value.get("loss")
        where = "the dict's 'loss'"
    else:
        loss = getattr(value, "loss", None)
        where = f"{type(value).__name__}.loss"
    if isinstance(loss, torch.Tensor):
        return loss
    if loss is None and (isinstance(value, Mapping) or hasattr(value, "loss")):
        raise TypeError(
            f"{where} is None: the model computed no loss (did it get the labels/targets?)"
        )
    raise TypeError(
        f"expected a loss tensor, or a dict/dataclass/ModelOutput with a 'loss' tensor; got "
        f"{type(value).__name__}"
    )
