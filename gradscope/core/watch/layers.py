"""Per-parameter figures to per-layer ones: a layer's norm is the root of its parameters'
sums of squares, its max |g| their maximum, and a layer none of whose parameters got a
gradient is frozen or without a gradient."""

from __future__ import annotations

import numpy as np

from gradscope.core.facts import STATUS_FROZEN, STATUS_NO_GRADIENT
from gradscope.core.watch.binding import Binding


def layer_norms_of_squares(binding: Binding, squares: np.ndarray) -> np.ndarray:
    """Per-layer L2 norms from the parameters' sums of squares."""
    if not len(binding.offsets):
        return np.zeros(0)
    members = squares if binding.members_in_order else squares[binding.members]
    return np.sqrt(np.add.reduceat(members, binding.offsets))


def layer_max(binding: Binding, param_max: np.ndarray) -> np.ndarray:
    """Per-layer max |g| from the parameters'."""
    if not len(binding.offsets):
        return np.zeros(0)
    members = param_max if binding.members_in_order else param_max[binding.members]
    return np.maximum.reduceat(members, binding.offsets)


def layer_sums(binding: Binding, per_param: np.ndarray) -> np.ndarray:
    """Per-layer sums of a per-parameter count."""
    if not len(binding.offsets):
        return np.zeros(0, dtype=per_param.dtype)
    return np.add.reduceat(per_param[binding.members], binding.offsets)


def absent_status(binding: Binding, layers: np.ndarray) -> np.ndarray:
    """frozen (no parameter requires a gradient) or no gradient, for layers whose
    parameters got none this step. Read now, so an unfrozen layer is picked up."""
    sizes = binding.layer_sizes[layers]
    starts = binding.offsets[layers]
    # Every member of those layers, layer after layer; one flag per member.
    members = binding.members[
        np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
    ]
    params = binding.params
    flags = np.fromiter((params[i].requires_grad for i in members.tolist()), bool, len(members))
    trainable = np.zeros(len(layers), dtype=bool)
    nonempty = sizes > 0
    if nonempty.any():
        bounds = np.concatenate([[0], np.cumsum(sizes)[:-1]])[nonempty]
        trainable[nonempty] = np.logical_or.reduceat(flags, bounds)
    return np.where(trainable, STATUS_NO_GRADIENT, STATUS_FROZEN).astype(np.uint8)
