"""The gradient watch: per-layer gradient statistics for every step, at the cost of a few
batched tensor ops and one host transfer per step.

No hooks are needed for the statistics themselves: after ``loss.backward()`` every watched
parameter's ``.grad`` is complete, so :meth:`GradientWatch.collect` reads them all at once with
``torch._foreach_*`` ops grouped by device and dtype, stacks the results into one vector per
device and copies it to the host in a single transfer. Per-layer aggregation then happens in
numpy on a few hundred numbers. Norms of half-precision gradients accumulate in float32, so a
finite fp16 gradient never reports a false Inf.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from gradscope.core.module_tree import select_layers

STATUS_OK, STATUS_VANISHING, STATUS_EXPLODING, STATUS_NONFINITE = 0, 1, 2, 3
STATUS_NAMES = ("ok", "vanishing", "exploding", "nonfinite")

_HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class LayerInfo:
    """A watched layer: a module and the parameters its statistics cover."""

    name: str
    type_name: str
    param_names: tuple[str, ...]
    num_params: int


@dataclass
class StepStats:
    """One step's statistics, as plain numpy (safe to send across threads and processes).

    Arrays are indexed like ``GradientWatch.layers`` (per layer) or
    ``GradientWatch.param_names`` (per parameter). ``update_ratio`` is None until the
    optimizer step it measures has run (and stays None when the option is off).
    """

    step: int
    loss: float | None
    total_grad_norm: float
    grad_norm: np.ndarray
    max_abs: np.ndarray
    weight_norm: np.ndarray
    nan_count: np.ndarray
    inf_count: np.ndarray
    status: np.ndarray
    param_grad_norm: np.ndarray
    update_ratio: np.ndarray | None = None
    loss_nonfinite: bool = False
    unwatched_nonfinite: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def nonfinite(self) -> bool:
        """True when anything of this step, watched or not, is NaN or Inf."""
        return self.loss_nonfinite or self.unwatched_nonfinite or bool(
            (self.status == STATUS_NONFINITE).any()
        )


def classify(
    grad_norm: np.ndarray,
    nonfinite_count: np.ndarray,
    explode_threshold: float,
    vanish_threshold: float,
) -> np.ndarray:
    """Status per layer: nonfinite beats exploding beats vanishing beats ok."""
    status = np.full(grad_norm.shape, STATUS_OK, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        status[grad_norm < vanish_threshold] = STATUS_VANISHING
        status[grad_norm > explode_threshold] = STATUS_EXPLODING
    status[(nonfinite_count > 0) | np.isnan(grad_norm)] = STATUS_NONFINITE
    return status


@dataclass
class _Group:
    """Parameters sharing a device and dtype when the watch was made: one set of foreach
    calls each. (Moving the model afterwards is fine: devices and dtypes are read again
    from the gradients at every step.)"""

    indices: list[int]
    params: list[torch.Tensor]


def _norm_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    return torch.float32 if tensor.dtype in _HALF_DTYPES else None


class GradientWatch:
    """Collect per-layer gradient statistics after each backward pass.

    ``layers``: None (every module owning trainable parameters), or module names / glob
    patterns. A selected module that owns no parameters of its own is watched over its
    whole subtree's parameters. Thresholds classify each layer as ok, vanishing (norm below
    ``vanish_threshold``), exploding (above ``explode_threshold``) or nonfinite.
    ``update_ratio=True`` also measures ||Δw||/||w|| of each optimizer step; pass
    ``optimizer`` so that happens by itself (otherwise call :meth:`measure_update` after
    ``optimizer.step()``); it costs a copy of the watched weights and one more transfer.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: str | Iterable[str] | None = None,
        *,
        explode_threshold: float = 1000.0,
        vanish_threshold: float = 1e-7,
        update_ratio: bool = False,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.model = model
        self.explode_threshold = float(explode_threshold)
        self.vanish_threshold = float(vanish_threshold)
        self.update_ratio_enabled = update_ratio
        if isinstance(layers, str):
            layers = [layers]
        names = select_layers(model, layers)
        modules = dict(model.named_modules())
        qualified = {id(p): n for n, p in model.named_parameters()}

        self.layers: list[LayerInfo] = []
        self._params: list[torch.Tensor] = []
        self.param_names: list[str] = []
        index_of: dict[int, int] = {}
        members: list[int] = []
        offsets: list[int] = []
        for name in names:
            module = modules[name]
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            covered = own or [p for p in module.parameters() if p.requires_grad]
            offsets.append(len(members))
            for p in covered:
                if id(p) not in index_of:
                    index_of[id(p)] = len(self._params)
                    self._params.append(p)
                    self.param_names.append(qualified[id(p)])
                members.append(index_of[id(p)])
            self.layers.append(
                LayerInfo(
                    name=name,
                    type_name=type(module).__name__,
                    param_names=tuple(qualified[id(p)] for p in covered),
                    num_params=sum(p.numel() for p in covered),
                )
            )
        self._members = np.asarray(members, dtype=np.intp)
        self._offsets = np.asarray(offsets, dtype=np.intp)
        # Unwatched trainable parameters still count towards the total norm, so a NaN
        # anywhere in the model is noticed even when only a few layers are watched.
        self._unwatched = [
            p for p in model.parameters() if p.requires_grad and id(p) not in index_of
        ]
        self._groups = self._group(self._params)
        self._unwatched_groups = self._group(self._unwatched)
        self._step = 0
        self._weights_before: list[tuple[_Group, list[int], list[torch.Tensor]]] | None = None
        self.last: StepStats | None = None
        self._handles: list[Any] = []
        if optimizer is not None and update_ratio:
            self._handles.append(
                optimizer.register_step_post_hook(lambda *_: self.measure_update())
            )

    # -- grouping ---------------------------------------------------------------------
    @staticmethod
    def _group(params: Sequence[torch.Tensor]) -> list[_Group]:
        groups: dict[tuple[torch.device, torch.dtype], _Group] = {}
        for index, p in enumerate(params):
            key = (p.device, p.dtype)
            if key not in groups:
                groups[key] = _Group([], [])
            groups[key].indices.append(index)
            groups[key].params.append(p)
        return list(groups.values())

    @property
    def step(self) -> int:
        """Index the next collected step will get."""
        return self._step

    # -- collection -------------------------------------------------------------------
    @torch.no_grad()
    def launch(self, loss: torch.Tensor | None = None) -> list[tuple[torch.Tensor, list]]:
        """Queue every statistic's computation and the device-to-host copies; no host
        synchronisation happens here (checked on CUDA by the benchmark)."""
        per_device: dict[torch.device, list[torch.Tensor]] = {}
        layout: dict[torch.device, list] = {}
        if self.update_ratio_enabled:
            self._weights_before = []
        for kind, groups in (("watched", self._groups), ("unwatched", self._unwatched_groups)):
            for group in groups:
                present = [i for i, p in enumerate(group.params) if p.grad is not None]
                if not present:
                    continue
                grads = [group.params[i].grad for i in present]
                device = grads[0].device
                pieces = per_device.setdefault(device, [])
                norm_dtype = _norm_dtype(grads[0])
                norms = torch._foreach_norm(grads, 2, dtype=norm_dtype)
                pieces.append(torch.stack(norms).to(torch.float64))
                entry = [kind, group, present]
                if kind == "watched":
                    extremes = [torch.aminmax(g) for g in grads if g.numel()]
                    nonempty = [i for i, g in zip(present, grads, strict=True) if g.numel()]
                    if extremes:
                        lows = torch.stack([e.min for e in extremes]).to(torch.float64)
                        highs = torch.stack([e.max for e in extremes]).to(torch.float64)
                        pieces.append(torch.maximum(highs, -lows))
                    weights = [group.params[i] for i in present]
                    weight_norms = torch._foreach_norm(weights, 2, dtype=norm_dtype)
                    pieces.append(torch.stack(weight_norms).to(torch.float64))
                    entry.append(nonempty)
                    if self.update_ratio_enabled:
                        copies = torch._foreach_mul(weights, 1.0)
                        self._weights_before.append((group, present, copies))
                layout.setdefault(device, []).append(entry)
        if loss is not None:
            device = loss.device
            per_device.setdefault(device, []).append(loss.detach().reshape(1).to(torch.float64))
            layout.setdefault(device, []).append(["loss"])
        transfers = []
        for device, pieces in per_device.items():
            vector = torch.cat(pieces)
            if vector.device.type != "cpu":
                host = torch.empty(vector.shape, dtype=vector.dtype, pin_memory=True)
                host.copy_(vector, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                transfers.append((host, layout[device], event))
            else:
                transfers.append((vector, layout[device], None))
        return transfers

    @torch.no_grad()
    def resolve(self, transfers: list) -> StepStats:
        """Wait for the copies queued by :meth:`launch` (the step's one synchronisation) and
        turn them into per-layer numpy statistics."""
        n_params = len(self._params)
        param_norm = np.zeros(n_params)
        param_max = np.zeros(n_params)
        param_weight = np.zeros(n_params)
        unwatched_sq = 0.0
        loss_value: float | None = None
        for host, entries, event in transfers:
            if event is not None:
                event.synchronize()
            values = host.numpy()
            cursor = 0
            for entry in entries:
                if entry[0] == "loss":
                    loss_value = float(values[cursor])
                    cursor += 1
                    continue
                kind, group, present = entry[0], entry[1], entry[2]
                count = len(present)
                norms = values[cursor : cursor + count]
                cursor += count
                if kind == "unwatched":
                    unwatched_sq += float(np.sum(np.square(norms)))
                    continue
                indices = np.asarray(group.indices, dtype=np.intp)
                param_norm[indices[present]] = norms
                nonempty = entry[3]
                param_max[indices[nonempty]] = values[cursor : cursor + len(nonempty)]
                cursor += len(nonempty)
                param_weight[indices[present]] = values[cursor : cursor + count]
                cursor += count

        nan_per_param = np.zeros(n_params, dtype=np.int64)
        inf_per_param = np.zeros(n_params, dtype=np.int64)
        suspicious = ~(np.isfinite(param_norm) & np.isfinite(param_max))
        if suspicious.any():
            self._count_nonfinite(np.flatnonzero(suspicious), param_norm, nan_per_param, inf_per_param)

        members, offsets = self._members, self._offsets
        with np.errstate(over="ignore", invalid="ignore"):
            if len(offsets):
                grad_norm = np.sqrt(np.add.reduceat(np.square(param_norm[members]), offsets))
                max_abs = np.maximum.reduceat(param_max[members], offsets)
                weight_norm = np.sqrt(np.add.reduceat(np.square(param_weight[members]), offsets))
                nan_count = np.add.reduceat(nan_per_param[members], offsets)
                inf_count = np.add.reduceat(inf_per_param[members], offsets)
            else:
                grad_norm = max_abs = weight_norm = np.zeros(0)
                nan_count = inf_count = np.zeros(0, dtype=np.int64)
            total = float(np.sqrt(np.sum(np.square(param_norm)) + unwatched_sq))
        status = classify(
            grad_norm, nan_count + inf_count, self.explode_threshold, self.vanish_threshold
        )
        stats = StepStats(
            step=self._step,
            loss=loss_value,
            total_grad_norm=total,
            grad_norm=grad_norm,
            max_abs=max_abs,
            weight_norm=weight_norm,
            nan_count=nan_count,
            inf_count=inf_count,
            status=status,
            param_grad_norm=param_norm,
            loss_nonfinite=loss_value is not None and not np.isfinite(loss_value),
            unwatched_nonfinite=not np.isfinite(unwatched_sq),
        )
        self._step += 1
        self.last = stats
        return stats

    def collect(self, loss: torch.Tensor | None = None) -> StepStats:
        """This step's statistics. Call after ``loss.backward()`` and before
        ``optimizer.step()`` (and before any in-place clipping, to see the raw gradients).
        Passing ``loss`` records it without a second synchronisation."""
        return self.resolve(self.launch(loss))

    def _count_nonfinite(
        self,
        suspects: np.ndarray,
        param_norm: np.ndarray,
        nan_out: np.ndarray,
        inf_out: np.ndarray,
    ) -> None:
        # Only on steps where something is already wrong: count NaN and Inf separately, and
        # tell a real Inf element from a float32 sum of squares that overflowed.
        counts = []
        for index in suspects:
            grad = self._params[index].grad
            counts.append(torch.stack([grad.isnan().sum(), grad.isinf().sum()]).cpu())
        for index, pair in zip(suspects, counts, strict=True):
            nan_out[index], inf_out[index] = int(pair[0]), int(pair[1])
            if nan_out[index] == 0 and inf_out[index] == 0:
                grad = self._params[index].grad
                param_norm[index] = float(torch.linalg.vector_norm(grad, dtype=torch.float64))

    @torch.no_grad()
    def measure_update(self) -> np.ndarray | None:
        """After ``optimizer.step()``: ||Δw||/||w|| per layer for the last collected step."""
        if self._weights_before is None or self.last is None:
            return None
        delta = np.zeros(len(self._params))
        pending = []
        for group, present, before in self._weights_before:
            now = [group.params[i] for i in present]
            diffs = torch._foreach_sub(now, before)
            norms = torch._foreach_norm(diffs, 2, dtype=_norm_dtype(now[0]))
            pending.append((np.asarray(group.indices, dtype=np.intp)[present], torch.stack(norms)))
        for indices, norms in pending:
            delta[indices] = norms.double().cpu().numpy()
        self._weights_before = None
        with np.errstate(divide="ignore", invalid="ignore"):
            layer_delta = np.sqrt(np.add.reduceat(np.square(delta[self._members]), self._offsets))
            weight = self.last.weight_norm
            ratio = np.where(
                weight > 0, layer_delta / weight, np.where(layer_delta > 0, np.inf, 0.0)
            )
        self.last.update_ratio = ratio
        return ratio

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        """Remove every hook this watch added (the statistics themselves need none)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> GradientWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
