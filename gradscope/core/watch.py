"""The gradient watch: per-layer gradient statistics for every step, at the cost of a few
batched tensor ops and one host transfer per step.

No hooks are needed for the statistics themselves: after ``loss.backward()`` every watched
parameter's ``.grad`` is complete, so :meth:`GradientWatch.collect` reads them all at once,
grouped by device and dtype, stacks the results into one vector per device and copies it to
the host in a single transfer. Per-layer aggregation then happens in numpy on a few hundred
numbers. Norms of half-precision gradients accumulate in float32, so a finite fp16 gradient
never reports a false Inf.

Cost: each statistic is one read of the data (gradients twice: L2 and max |g|; weights once).
On CUDA these are three fused ``_foreach_norm`` launches per group. On CPU, where
``_foreach_norm`` is a loop of single-threaded norms and its ord=inf is about 7x slower still,
each gradient gets a BLAS dot product (sum of squares) and, while it is still in cache, one
``aminmax``; weights get dot products. On a CPU those reads are memory-bound and cost what
they cost: about 10% of a resnet18 step and 25-30% of a 20-layer MLP step on 2 cores, close to
what the same reads cost by plain torch calls (see ``benchmarks/overhead.py``, ``reads_only``).
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
# Gradients whose sums of squares the CPU path takes as dot products.
_DOT_DTYPES = (torch.float32, torch.float64)
# By accumulation dtype: the max |g| under which squares underflow and a norm (torch's own
# included) loses precision or reads 0; such parameters are recomputed exactly in resolve.
_TINY = {torch.float32: 1e-15, torch.float64: 1e-140}
# Device types that take the per-tensor path (dot + aminmax) rather than the fused
# ``_foreach_norm`` one; the tests also run the fused path on CPU by emptying this.
_PER_TENSOR_DEVICES: tuple[str, ...] = ("cpu",)


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
    """Parameters sharing a device and dtype when the watch was made: one batch of calls
    each. (Moving the model afterwards is fine: devices and dtypes are read again from the
    gradients at every step.) The lists are built once; only ``.grad`` is read per step."""

    indices: list[int]
    params: list[torch.Tensor]
    index_array: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    # Positions (in ``params``) of parameters with no elements: aminmax cannot reduce them.
    empty: frozenset[int] = frozenset()

    def freeze(self) -> _Group:
        self.index_array = np.asarray(self.indices, dtype=np.intp)
        self.empty = frozenset(i for i, p in enumerate(self.params) if p.numel() == 0)
        return self


@dataclass
class _Entry:
    """Where one group's numbers sit in its device's vector (see ``GradientWatch.launch``).

    ``present`` is None when every parameter of the group had a gradient. ``squared``:
    the gradient and weight figures are sums of squares (CPU dot products), not norms.
    Layout, ``interleaved`` (CPU): a (figure, min, max) triple per present gradient (min and
    max from aminmax), then one figure per weight of the group. Otherwise (fused): the
    gradient figures, then the weights', then max |g| of the non-empty gradients.
    Unwatched entries hold gradient figures only.
    """

    kind: str
    group: _Group | None = None
    present: list[int] | None = None
    count: int = 0
    nonempty: list[int] | None = None
    squared: bool = False
    interleaved: bool = False
    tiny: float = 0.0


def _norm_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    return torch.float32 if tensor.dtype in _HALF_DTYPES else None


def _exact_norm(grad: torch.Tensor) -> float:
    """L2 norm in float64, scaled by max |g| so that neither the squares of huge elements
    overflow nor those of tiny ones underflow. For the rare parameters flagged in resolve."""
    grad = grad.detach().double()
    scale = float(grad.abs().max()) if grad.numel() else 0.0
    if scale == 0.0 or not np.isfinite(scale):
        return float(torch.linalg.vector_norm(grad))
    return scale * float(torch.linalg.vector_norm(grad / scale))


def _sum_squares(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per-tensor sum of squares on CPU, one pass each. A BLAS dot product is 1.5-3x faster
    there than ``torch._foreach_norm`` (a loop of single-threaded norms on CPU)."""
    out = []
    for t in tensors:
        if t.is_contiguous():
            flat = t.view(-1)
            out.append(torch.dot(flat, flat))
        else:
            out.append(torch.linalg.vector_norm(t).square())
    return out


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
        self._weights_before: list[tuple[_Group, list[torch.Tensor]]] | None = None
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
        return [group.freeze() for group in groups.values()]

    @property
    def step(self) -> int:
        """Index the next collected step will get."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        # A runner that replaces or rewinds its watch keeps the step numbering going.
        self._step = int(value)

    # -- collection -------------------------------------------------------------------
    @torch.no_grad()
    def launch(self, loss: torch.Tensor | None = None) -> list[tuple[torch.Tensor, list, Any]]:
        """Queue every statistic's computation and the device-to-host copies; no host
        synchronisation happens here (checked on CUDA by the benchmark and tests).

        Per group of parameters (same device and dtype) the device work is: gradient and
        weight L2 figures, and max |g|, all as 0-d tensors that one ``torch.stack`` per
        device turns into the vector that is copied to the host. On CUDA that is two fused
        ``_foreach_norm`` launches (ord 2 over gradients and weights, ord inf over
        gradients). On CPU, where ``_foreach_norm`` is a loop of single-threaded norms and
        ord inf is 7x slower still, it is a BLAS dot product per tensor (sum of squares) and
        one ``aminmax`` per gradient; sums of squares that overflow or underflow float are
        recomputed exactly in :meth:`resolve` (rare steps only).
        """
        parts: dict[torch.device, list[torch.Tensor]] = {}
        layout: dict[torch.device, list[_Entry]] = {}
        copy_weights = self.update_ratio_enabled
        self._weights_before = [] if copy_weights else None
        for group in self._groups:
            params = group.params
            grads = [p.grad for p in params]
            present = None
            if any(g is None for g in grads):
                present = [i for i, g in enumerate(grads) if g is not None]
                grads = [grads[i] for i in present]
            sample = grads[0] if grads else params[0]
            device = sample.device
            pieces = parts.setdefault(device, [])
            norm_dtype = _norm_dtype(sample)
            on_cpu = device.type in _PER_TENSOR_DEVICES
            squared = on_cpu and sample.dtype in _DOT_DTYPES
            nonempty = None
            if on_cpu:
                # Gradient by gradient, so that aminmax reads it while it is still in cache.
                for g in grads:
                    if squared and g.is_contiguous():
                        flat = g.view(-1)
                        pieces.append(torch.dot(flat, flat))
                    elif squared:
                        pieces.append(torch.linalg.vector_norm(g).square())
                    else:
                        pieces.append(torch.linalg.vector_norm(g, dtype=norm_dtype))
                    if g.numel():
                        pieces += torch.aminmax(g)
                    else:
                        pieces += (g.new_zeros(()), g.new_zeros(()))
                if squared:
                    pieces += _sum_squares(params)
                else:
                    pieces += torch._foreach_norm(params, 2, dtype=norm_dtype)
            else:
                pieces += torch._foreach_norm(grads + params, 2, dtype=norm_dtype)
                if group.empty:
                    positions = present if present is not None else range(len(params))
                    nonempty = [k for k, i in enumerate(positions) if i not in group.empty]
                    grads = [grads[k] for k in nonempty]
                if grads:
                    pieces += torch._foreach_norm(grads, float("inf"))
            layout.setdefault(device, []).append(
                _Entry(
                    "watched",
                    group,
                    present,
                    len(params) if present is None else len(present),
                    nonempty,
                    squared,
                    interleaved=on_cpu,
                    tiny=_TINY[torch.float64 if sample.dtype == torch.float64 else torch.float32],
                )
            )
            if copy_weights:
                self._weights_before.append((group, torch._foreach_mul(params, 1.0)))
        for group in self._unwatched_groups:
            present = [i for i, p in enumerate(group.params) if p.grad is not None]
            if not present:
                continue
            grads = [group.params[i].grad for i in present]
            device = grads[0].device
            squared = device.type in _PER_TENSOR_DEVICES and grads[0].dtype in _DOT_DTYPES
            if squared:
                figures = _sum_squares(grads)
            else:
                figures = list(torch._foreach_norm(grads, 2, dtype=_norm_dtype(grads[0])))
            parts.setdefault(device, []).extend(figures)
            layout.setdefault(device, []).append(
                _Entry("unwatched", group, present, len(present), squared=squared)
            )
        if loss is not None:
            device = loss.device
            parts.setdefault(device, []).append(loss.detach().reshape(()))
            layout.setdefault(device, []).append(_Entry("loss"))
        transfers = []
        for device, pieces in parts.items():
            vector = torch.stack(pieces)
            if vector.dtype not in (torch.float32, torch.float64):
                vector = vector.float()
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
        unwatched_bad: list[tuple[_Group, list[int]]] = []
        imprecise: list[np.ndarray] = []
        loss_value: float | None = None
        for host, entries, event in transfers:
            if event is not None:
                event.synchronize()
            values = host.numpy().astype(np.float64)
            cursor = 0
            for entry in entries:
                if entry.kind == "loss":
                    loss_value = float(values[cursor])
                    cursor += 1
                    continue
                group = entry.group
                count = entry.count
                if entry.interleaved:  # CPU: (figure, min, max) per gradient
                    triples = values[cursor : cursor + 3 * count].reshape(count, 3)
                    cursor += 3 * count
                    grad_figures = triples[:, 0]
                else:
                    grad_figures = values[cursor : cursor + count]
                    cursor += count
                if entry.kind == "unwatched":
                    squares = grad_figures if entry.squared else np.square(grad_figures)
                    if np.isfinite(squares).all():
                        unwatched_sq += float(np.sum(squares))
                    else:  # a real NaN/Inf, or only an overflowed sum: look closer
                        unwatched_bad.append((group, entry.present))
                    continue
                indices = group.index_array
                if entry.present is not None:
                    indices = indices[entry.present]
                weights = values[cursor : cursor + len(group.params)]
                cursor += len(group.params)
                if entry.squared:
                    grad_figures = np.sqrt(grad_figures)
                    weights = np.sqrt(weights)
                param_norm[indices] = grad_figures
                param_weight[group.index_array] = weights
                if entry.interleaved:
                    maxima = np.maximum(triples[:, 2], -triples[:, 1])
                else:
                    if entry.nonempty is not None:
                        indices = indices[entry.nonempty]
                    maxima = values[cursor : cursor + len(indices)]
                    cursor += len(indices)
                param_max[indices] = maxima
                if entry.tiny:
                    # Squares of elements this small underflow: the sum is not exact.
                    low = (maxima > 0) & (maxima < entry.tiny)
                    if low.any():
                        imprecise.append(indices[low])

        nan_per_param = np.zeros(n_params, dtype=np.int64)
        inf_per_param = np.zeros(n_params, dtype=np.int64)
        suspicious = ~(np.isfinite(param_norm) & np.isfinite(param_max))
        if suspicious.any():
            self._count_nonfinite(
                np.flatnonzero(suspicious), param_norm, nan_per_param, inf_per_param
            )
        for indices in imprecise:
            for index in indices:
                param_norm[index] = _exact_norm(self._params[index].grad)
        if unwatched_bad:
            unwatched_sq += self._unwatched_squares(unwatched_bad)

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
        # tell a real Inf element from a sum of squares that overflowed.
        pairs = [
            torch.stack([g.isnan().sum(), g.isinf().sum()])
            for g in (self._params[index].grad for index in suspects)
        ]
        counts = [pair.cpu().numpy() for pair in pairs]  # devices may differ
        for index, (nans, infs) in zip(suspects, counts, strict=True):
            nan_out[index], inf_out[index] = int(nans), int(infs)
            if nans == 0 and infs == 0:
                param_norm[index] = _exact_norm(self._params[index].grad)

    @staticmethod
    def _unwatched_squares(bad: list[tuple[_Group, list[int]]]) -> float:
        total = 0.0
        for group, present in bad:
            for i in present:
                grad = group.params[i].grad
                if bool(torch.isfinite(grad).all()):
                    total += _exact_norm(grad) ** 2
                else:
                    return float("nan")
        return total

    @torch.no_grad()
    def measure_update(self) -> np.ndarray | None:
        """After ``optimizer.step()``: ||Δw||/||w|| per layer for the last collected step."""
        if self._weights_before is None or self.last is None:
            return None
        delta = np.zeros(len(self._params))
        pending = []
        for group, before in self._weights_before:
            now = group.params
            diffs = torch._foreach_sub(now, before)
            norms = torch._foreach_norm(diffs, 2, dtype=_norm_dtype(now[0]))
            pending.append((group.index_array, torch.stack(norms)))
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
