"""Model shapes real projects have, each with a known NaN/Inf (used by test_origin_cases and
test_diagnosis): bad data, additive -inf masks, activation checkpointing, custom autograd
Functions, losses computed inside ``forward``. Lines the tests look for are marked
``# <- name``."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


# -- bad data -------------------------------------------------------------------------------
class TabularNet(nn.Module):
    """Numeric features and category ids, as ``model(**inputs)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, numeric: torch.Tensor, category: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([numeric, self.embed(category)], dim=1))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x)).mean(dim=(2, 3))
        return self.head(h)


class SentinelOverflow(nn.Module):
    """Gets a ``max_len`` tensor of +inf ("no limit") it never uses, and overflows on its
    own in ``amplify``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.amplify = Exp()

    def forward(self, x: torch.Tensor, max_len: torch.Tensor) -> torch.Tensor:
        return self.amplify(self.proj(x) * 200)


class Exp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x)  # <- exp


# -- additive masks ---------------------------------------------------------------------------
class MaskedAttention(nn.Module):
    """Hand-written attention that adds an additive (0 / -inf) mask to the scores."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        scores = scores + mask
        weights = torch.softmax(scores, dim=-1)  # <- softmax
        return weights @ v


class MaskedEncoder(nn.Module):
    """An additive mask passed as an input, as in many transformer codebases; ``head``
    optionally takes a log of zero (a failure that has nothing to do with the mask)."""

    def __init__(self, log_of_zero: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attn = MaskedAttention()
        self.head = LogHead() if log_of_zero else nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(self.embed(x), mask)).mean(dim=1)


class LogHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.relu(self.lin(h)) * 0)  # <- log of zero


def additive_mask(batch: int, length: int, empty_row: bool = False) -> torch.Tensor:
    """Causal mask, 0 where attending is allowed and -inf elsewhere; ``empty_row`` masks
    every key of the first query of the first sequence."""
    mask = torch.full((length, length), float("-inf")).triu(1)
    mask = mask.expand(batch, length, length).clone()
    if empty_row:
        mask[0, 0, :] = float("-inf")
    return mask


# -- activation checkpointing -------------------------------------------------------------------
class DistanceBlock(nn.Module):
    """Hand-written norm: sqrt of 0 for a zero row, so its backward is Inf."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x) * 0
        return h + h.pow(2).sum(dim=1, keepdim=True).sqrt()  # <- sqrt


class LogBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return torch.log(h - h.max())  # <- checkpointed log


class SqrtHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) * 0).pow(2).sqrt()  # <- head sqrt


class Checkpointed(nn.Module):
    """``block`` run plainly or under activation checkpointing: "none", "reentrant",
    "non-reentrant", "sequential-reentrant", "sequential-non-reentrant"."""

    def __init__(self, block: nn.Module, mode: str = "none", head: nn.Module | None = None):
        super().__init__()
        self.mode = mode
        self.inp = nn.Linear(4, 4)
        self.blocks = nn.Sequential(nn.Linear(4, 4), block)
        self.head = head or nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if self.mode == "none":
            h = self.blocks(h)
        elif self.mode == "reentrant":
            h = checkpoint(self.blocks, h, use_reentrant=True)
        elif self.mode == "non-reentrant":
            h = checkpoint(self.blocks, h, use_reentrant=False)
        else:
            reentrant = self.mode == "sequential-reentrant"
            h = checkpoint_sequential(self.blocks, 2, h, use_reentrant=reentrant)
        return self.head(h)


CHECKPOINT_MODES = (
    "reentrant",
    "non-reentrant",
    "sequential-reentrant",
    "sequential-non-reentrant",
)


# -- custom autograd Functions -------------------------------------------------------------------
class UnsafeLog(torch.autograd.Function):
    """log with a hand-written backward; its forward makes -inf at 0."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.log(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / x


class NormalizeGrad(torch.autograd.Function):
    """Identity forward; backward divides the gradient by its norm: 0/0 for a zero one."""

    @staticmethod
    def forward(x):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        zeroed = grad * 0
        return zeroed / zeroed.norm()


class FeatureLog(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.lin(x)) * 0
        return UnsafeLog.apply(h)  # <- UnsafeLog.apply


class GradNormalizer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NormalizeGrad.apply(self.lin(x))  # <- NormalizeGrad.apply


class FunctionNet(nn.Module):
    def __init__(self, part: nn.Module) -> None:
        super().__init__()
        self.part = part
        self.after = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(torch.tanh(self.part(x)))


# -- losses inside forward ---------------------------------------------------------------------
@dataclass
class ClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


class ModelOutputLike(OrderedDict):
    """The shape of transformers' ``ModelOutput``: a dict whose keys are also attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class LossInForward(nn.Module):
    """Computes its cross-entropy inside ``forward`` and returns it in a dict, a dataclass
    or a ModelOutput-like object, as Hugging Face models do."""

    def __init__(self, returns: str = "dict") -> None:
        super().__init__()
        self.returns = returns
        self.body = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor):
        logits = self.body(x)
        loss = F.cross_entropy(logits, labels)  # <- loss in forward
        if self.returns == "dict":
            return {"loss": loss, "logits": logits}
        if self.returns == "dataclass":
            return ClassifierOutput(loss=loss, logits=logits)
        return ModelOutputLike(loss=loss, logits=logits)


class CriterionInForward(nn.Module):
    """The loss made by a child loss module."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 3)
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.body(x)
        return {"loss": self.criterion(logits, labels), "logits": logits}


# -- restore ---------------------------------------------------------------------------------
class StatefulNet(nn.Module):
    """BatchNorm statistics and an Embedding with ``max_norm`` (its forward renormalises
    the weight rows in place); a sqrt of 0 gives an Inf gradient in backward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4, max_norm=0.5)
        self.norm = nn.BatchNorm1d(4)
        self.gate = SqrtHead()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gate(self.norm(self.embed(ids)))


# -- evidence for hints ---------------------------------------------------------------------------
class HandLayerNorm(nn.Module):
    """A hand-written LayerNorm as many codebases have (BERT's eps is 1e-12)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)
        variance = centred.pow(2).mean(dim=-1, keepdim=True)
        return self.weight * centred * torch.rsqrt(variance + self.eps)  # <- rsqrt


class NormedEncoder(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = HandLayerNorm(8, eps)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.proj(x)))


class CausalScores(nn.Module):
    """Returns scores with a causal -inf mask registered as a buffer at construction."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.register_buffer("mask", torch.full((length, length), float("-inf")).triu(1))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return scores + self.mask


class BufferMaskedNet(nn.Module):
    """A causal-mask module whose output holds -inf by design, then a real failure in
    ``head`` (log of zero)."""

    def __init__(self, length: int = 5) -> None:
        super().__init__()
        self.qk = nn.Linear(4, 8)
        self.causal = CausalScores(length)
        self.head = LogHead()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.qk(x)
        weights = torch.softmax(self.causal(h @ h.transpose(-2, -1)), dim=-1)
        return self.head(weights @ h).mean()


class NanAwareNet(nn.Module):
    """Missing sensor readings come as NaN by design and are imputed in ``impute``; the
    model's own failure is a log of zero in ``head``."""

    def __init__(self) -> None:
        super().__init__()
        self.impute = Impute()
        self.body = nn.Linear(4, 8)
        self.head = LogHead()

    def forward(self, readings: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.impute(readings)))


class Impute(nn.Module):
    def forward(self, readings: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.isnan(readings), torch.zeros_like(readings), readings)


class Saturate(nn.Module):
    """Overflows inside and cleans it up: its output is finite."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(torch.exp(x * 1000), posinf=1.0)


class AbsorbedThenRoot(nn.Module):
    """``saturate`` makes and absorbs an Inf; then the root's own code divides by zero and
    ``second`` turns that Inf into NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.saturate = Saturate()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(self.saturate(x))
        h = h / torch.zeros_like(h)  # <- root division
        return self.second(h)
