"""Models that mask logits to -inf over a restricted vocabulary, as constrained decoding and
token-restricted fine-tuning do. The -inf is by design; what a later op does with it is not."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def allowed_tokens(vocab: int, allowed: int) -> torch.Tensor:
    """True for the first ``allowed`` token ids of a ``vocab``-sized vocabulary."""
    keep = torch.zeros(vocab, dtype=torch.bool)
    keep[:allowed] = True
    return keep


class RestrictedVocabSmoothedLM(nn.Module):
    """A tiny language model whose loss is HF-style label smoothing computed in forward:
    ``-log_softmax`` summed over the whole vocabulary. The masked positions are +inf after
    the negation, so the sum is +inf: the smoothing sums over what the mask removed."""

    def __init__(self, vocab: int = 12, allowed: int = 6, epsilon: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, vocab)
        self.epsilon = epsilon
        self.register_buffer("keep", allowed_tokens(vocab, allowed))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(tokens))
        logits = logits.masked_fill(~self.keep, float("-inf"))  # <- vocabulary mask
        log_probs = -F.log_softmax(logits, dim=-1)
        nll = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        smoothed = log_probs.sum(dim=-1)  # <- smoothing sum
        return ((1 - self.epsilon) * nll + self.epsilon / log_probs.shape[-1] * smoothed).mean()


class RestrictedVocabSafeLM(nn.Module):
    """The same mask consumed safely: cross-entropy over the allowed targets only sees the
    -inf through log_softmax, and the masked positions never reach a sum."""

    def __init__(self, vocab: int = 12, allowed: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, vocab)
        self.register_buffer("keep", allowed_tokens(vocab, allowed))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(tokens)).masked_fill(~self.keep, float("-inf"))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
