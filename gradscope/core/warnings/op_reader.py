"""The op-level reader of the early warnings (#37): what no module returns, read from the
operations themselves on the steps the forward statistics are due.

A module's output never shows ``q @ k^T``: ``F.scaled_dot_product_attention``,
``nn.MultiheadAttention`` and a softmax or ``exp`` written inline in a forward all compute
their logits inside one call. So on a due step (and only then, and only with
``early_warnings=True``) a ``TorchFunctionMode`` is pushed for the watched model's forward
(a pre-hook and an always-called hook on the model, present for that step only) and reads:

- ``F.scaled_dot_product_attention``: the max attention logit, ``max(q k^T * scale)`` with
  its mask (a boolean mask's False and the causal future left out; a float mask added), on
  the batch's first element (all heads): 1/batch of the attention's own matmul;
- softmax and log_softmax (``torch.``, ``F.``, ``Tensor.``): the max of their input, a logit
  as Dehghani et al. 2023 and Wortsman et al. 2023 plot it ("max attention logit"): the
  signed maximum, not the spread, since a -inf or dtype-min mask makes the minimum say
  nothing; named "attention max logit" for scores of 3 or more dimensions (batch, heads,
  queries x keys) and "softmax max logit" otherwise;
- ``exp`` (``torch.exp``, ``Tensor.exp``, ``exp_``): the max of its input, against the point
  where exp overflows in the input's dtype (float32 under autocast);
- ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``): a mode is off inside its
  own handler, so the softmax or SDPA inside is not seen; the max attention logit is
  computed from its arguments instead (the in-projection of queries and keys of the
  batch's first element, its masks; not read with ``bias_k``, ``add_zero_attn`` or
  ``static_k``).

Each figure is named after the innermost module whose forward is running (parameter-free
ones too; found by walking the frames to the nearest ``Module._call_impl``: the reads are a
few a layer, the modules' calls many more), one figure per (module, quantity) a step, the
max over its calls, kept as a 0-d tensor on the device until the step's read. Nothing is
read under ``no_grad`` (an evaluation pass), in a checkpointed block's recomputation, or
while dynamo traces; a compiled model is not read at all (``skipped`` says why). The values
are computed under ``no_grad`` from detached inputs: the step's results do not change.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from gradscope.core.user_warnings import warn_user
from gradscope.core.warnings.monitor import EXPONENT, MAGNITUDE, Observation
from gradscope.core.wrappers import is_compiled, named_layers

# Why a compiled model's ops are not read (the reader's ``skipped``).
COMPILED = "the model is compiled (torch.compile): its ops are not read"
ATTENTION_LOGIT = "attention max logit"
SOFTMAX_LOGIT = "softmax max logit"
EXP_INPUT = "exp input max"

_CALL_IMPL = nn.Module._call_impl.__code__
# Inside a backward (a checkpointed block recomputed there) it is not -1.
_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)
# An exp input, a softmax logit, an attention logit: each may rise by nats as a model learns;
# only its approach to a limit, or a sustained growth of the logit's size, is a warning.
_EXP_DETECTORS = ("headroom", "drift")
_LOGIT_DETECTORS = ("headroom", "spike", "drift")


@dataclass
class _Figure:
    module: str
    quantity: str
    value: torch.Tensor  # 0-d float32, on the device
    dtype: torch.dtype | None
    scale: str
    detectors: tuple[str, ...]
    module_type: str


def _argument(args: tuple, kwargs: dict[str, Any], index: int, name: str, default: Any) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def attention_max_logit(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``max(query @ key^T * scale)`` over the positions ``F.scaled_dot_product_attention``
    attends to, on the first element of the batch (all heads), in float32; a 0-d tensor
    (-inf when nothing is attended)."""
    if query.dim() >= 3:  # (batch, ..., L, E): the first element, its dimensions kept
        query, key = query[:1], key[:1]
        if attn_mask is not None and attn_mask.dim() == query.dim() and attn_mask.shape[0] > 1:
            attn_mask = attn_mask[:1]
    query, key = query.float(), key.float()
    if enable_gqa and query.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    factor = query.shape[-1] ** -0.5 if scale is None else scale
    logits = query @ key.transpose(-2, -1) * factor
    length, keys = logits.shape[-2], logits.shape[-1]
    if is_causal:
        future = torch.ones(length, keys, dtype=torch.bool, device=logits.device).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask.float()
    return logits.amax()


class _ReadingMode(TorchFunctionMode):
    def __init__(self, reader: OpReader) -> None:
        super().__init__()
        self.reader = reader

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        read = _READS.get(func)
        if read is not None:
            self.reader.read(read, func, args, kwargs)
        return func(*args, **kwargs)


def _read_attention(
    args: tuple, kwargs: dict[str, Any], autocast: torch.dtype | None
) -> tuple[str, torch.Tensor, Any, str]:
    query, key = _argument(args, kwargs, 0, "query", None), _argument(args, kwargs, 1, "key", None)
    value = attention_max_logit(
        query.detach(),
        key.detach(),
        _argument(args, kwargs, 3, "attn_mask", None),
        bool(_argument(args, kwargs, 5, "is_causal", False)),
        kwargs.get("scale"),
        bool(kwargs.get("enable_gqa", False)),
    )
    # No dtype limit: SDPA's kernels (flash, memory-efficient, and the CPU's) keep the
    # logits in float32 whatever q and k's dtype; only their growth is watched.
    return ATTENTION_LOGIT, value, None, MAGNITUDE


def _multi_head_attention_logit(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    names = (
        "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight",
        "in_proj_bias", "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight",
        "out_proj_bias", "training", "key_padding_mask", "need_weights", "attn_mask",
        "use_separate_proj_weight", "q_proj_weight", "k_proj_weight",
    )  # fmt: skip
    given = dict(zip(names, args, strict=False)) | kwargs
    if (
        given.get("bias_k") is not None
        or given.get("add_zero_attn")
        or given.get("static_k") is not None
    ):
        return None
    query, key, heads = given["query"], given["key"], int(given["num_heads"])
    if query.dim() == 3:  # (L, N, E): the batch's first element
        query, key = query[:, 0], key[:, 0]
    width = query.shape[-1]
    if given.get("use_separate_proj_weight"):
        query_weight, key_weight = given["q_proj_weight"], given["k_proj_weight"]
    else:
        query_weight, key_weight = (
            given["in_proj_weight"][:width],
            given["in_proj_weight"][width : 2 * width],
        )
    bias = given.get("in_proj_bias")
    query_bias = None if bias is None else bias[:width].float()
    key_bias = None if bias is None else bias[width : 2 * width].float()
    queries = F.linear(query.float(), query_weight.float(), query_bias)
    keys = F.linear(key.float(), key_weight.float(), key_bias)
    queries = queries.view(queries.shape[0], heads, -1).transpose(0, 1)
    keys = keys.view(keys.shape[0], heads, -1).transpose(0, 1)
    logits = queries @ keys.transpose(-2, -1) * (width // heads) ** -0.5  # (heads, L, S)
    mask = given.get("attn_mask")
    if mask is None and given.get("is_causal"):
        length = logits.shape[-2]
        mask = torch.ones(length, logits.shape[-1], dtype=torch.bool, device=logits.device).triu(1)
    padding = given.get("key_padding_mask")
    for each in (
        mask if mask is None or mask.dim() == 2 else mask[:heads],
        None if padding is None else padding[:1, None],
    ):
        if each is None:
            continue
        if each.dtype == torch.bool:  # True: not attended (the opposite of SDPA's)
            logits = logits.masked_fill(each, float("-inf"))
        else:
            logits = logits + each.float()
    return logits.amax()


def _read_multi_head_attention(
    args: tuple, kwargs: dict[str, Any], autocast: torch.dtype | None
) -> tuple[str, torch.Tensor, Any, str] | None:
    value = _multi_head_attention_logit(args, kwargs)
    if value is None:
        return None
    query = args[0] if args else kwargs["query"]
    dtype = query.dtype if autocast is None else autocast  # q k^T in autocast's dtype
    return ATTENTION_LOGIT, value, dtype, MAGNITUDE


def _first_tensor(args: tuple, kwargs: dict[str, Any]) -> Any:
    """A one-tensor op's input, however it was passed: first positional, ``input=`` (the
    functions) or ``self=`` (the Tensor methods)."""
    found = _argument(args, kwargs, 0, "input", None)
    return kwargs.get("self") if found is None else found


def _read_softmax(
    args: tuple, kwargs: dict[str, Any], autocast: torch.dtype | None
) -> tuple[str, torch.Tensor, Any, str]:
    logits = _first_tensor(args, kwargs)
    quantity = ATTENTION_LOGIT if logits.dim() >= 3 else SOFTMAX_LOGIT
    return quantity, logits.detach().amax().float(), logits.dtype, MAGNITUDE


def _read_exp(
    args: tuple, kwargs: dict[str, Any], autocast: torch.dtype | None
) -> tuple[str, torch.Tensor, Any, str]:
    exponent = _first_tensor(args, kwargs)
    dtype = exponent.dtype if autocast is None else torch.float32  # autocast's exp: float32
    return EXP_INPUT, exponent.detach().amax().float(), dtype, EXPONENT


_READS: dict[Any, Callable[..., tuple[str, torch.Tensor, Any, str] | None]] = {
    F.scaled_dot_product_attention: _read_attention,
    F.multi_head_attention_forward: _read_multi_head_attention,
    **dict.fromkeys(
        (torch.softmax, torch.Tensor.softmax, F.softmax, torch.log_softmax),
        _read_softmax,
    ),
    **dict.fromkeys((torch.Tensor.log_softmax, F.log_softmax), _read_softmax),
    **dict.fromkeys((torch.exp, torch.Tensor.exp, torch.exp_, torch.Tensor.exp_), _read_exp),
}


class OpReader:
    """The op-level figures of one watch: :meth:`arm` before a due step, :meth:`take`
    (0-d tensors) when the step is launched, :meth:`observations` after its read."""

    def __init__(self) -> None:
        self._mode = _ReadingMode(self)
        self._handles: list[Any] = []
        self._names: dict[int, tuple[str, str]] = {}
        self._model: nn.Module | None = None
        self._running: dict[tuple[str, str], _Figure] = {}
        self._inside = 0
        self.skipped: str | None = None  # why the reader is off (a compiled model, an error)

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self, model: nn.Module, wrapped_model: nn.Module) -> None:
        """Read the ops of ``model``'s next forward (hooks kept if already armed)."""
        if self.armed or self.skipped is not None:
            return
        if is_compiled(model, wrapped_model):
            self.skip(COMPILED)
            return
        if self._model is not model:
            self._model = model
            self._names = {
                id(module): (name, type(module).__name__)
                for name, module in named_layers(model).items()
            }
        self._running.clear()
        self._handles = [
            model.register_forward_pre_hook(self._enter),
            model.register_forward_hook(self._leave, always_call=True),
        ]

    def skip(self, reason: str) -> None:
        self.skipped = reason
        warn_user(f"gradscope early warnings: attention logits and exp inputs not read: {reason}")
        self.disarm()

    def _enter(self, module: nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if self._inside == 0 and torch.is_grad_enabled() and _graph_task() == -1:
            self._mode.__enter__()
            self._inside = 1
        elif self._inside:
            self._inside += 1  # the model called within itself

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._inside == 0:
            return
        self._inside -= 1
        if self._inside == 0:
            self._mode.__exit__(None, None, None)

    def read(self, read: Callable, func: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Called by the mode before ``func`` runs (an in-place exp_ still sees its input)."""
        if not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return
        first = args[0] if args else next(iter(kwargs.values()), None)
        if not isinstance(first, torch.Tensor) or not first.is_floating_point():
            return
        if first.numel() == 0:
            return
        try:
            # Computed in float32 as written: the model's autocast would run the reader's
            # matmuls in float16, where the logits it measures overflow first.
            device = first.device.type
            autocast = (
                torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
            )
            with torch.no_grad(), torch.autocast(device, enabled=False):
                found = read(args, kwargs, autocast)
        except Exception as error:  # never the user's training's problem
            self.skip(f"reading {getattr(func, '__name__', func)} raised {error!r}")
            return
        if found is None:
            return
        quantity, value, dtype, scale = found
        name, module_type = self._innermost()
        key = (name, quantity)
        running = self._running.get(key)
        if running is None:
            detectors = _EXP_DETECTORS if scale == EXPONENT else _LOGIT_DETECTORS
            self._running[key] = _Figure(
                name, quantity, value, dtype, scale, detectors, module_type
            )
        else:
            running.value = torch.maximum(running.value, value)
            narrower = dtype is not None and (
                running.dtype is None or dtype.itemsize < running.dtype.itemsize
            )
            if narrower:
                running.dtype = dtype  # the narrower dtype's limits apply

    def _innermost(self) -> tuple[str, str]:
        """The innermost module of the model whose forward is running (its name and type)."""
        frame = sys._getframe(3)
        while frame is not None:
            if frame.f_code is _CALL_IMPL:
                found = self._names.get(id(frame.f_locals.get("self")))
                if found is not None:
                    return found
            frame = frame.f_back
        return ("", type(self._model).__name__)

    def take(self) -> list[_Figure]:
        """The step's figures (0-d tensors, not read yet); the hooks are removed."""
        self.disarm()
        figures = list(self._running.values())
        self._running.clear()
        return figures

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._inside:  # a forward left without its hook (never seen; kept safe)
            self._inside = 0
            self._mode.__exit__(None, None, None)


def op_observations(figures: list[_Figure]) -> list[Observation]:
    """The figures as observations: one host copy per device (after the step's own read,
    when nothing of the step is left queued)."""
    if not figures:
        return []
    by_device: dict[torch.device, list[_Figure]] = {}
    for figure in figures:
        by_device.setdefault(figure.value.device, []).append(figure)
    found = []
    for group in by_device.values():
        values = torch.stack([figure.value for figure in group]).tolist()
        for figure, value in zip(group, values, strict=True):
            found.append(
                Observation(
                    figure.module,
                    figure.quantity,
                    value,
                    figure.dtype,
                    figure.scale,
                    figure.detectors,
                    figure.module_type,
                )
            )
    return found
