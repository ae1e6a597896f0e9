"""NaN from a built-in layer: ``nn.MultiheadAttention`` with every key of a row masked.

A sentence classifier pads its batches and passes ``key_padding_mask`` (True = padding) to
``nn.MultiheadAttention``. One example in each batch is an empty text (it was all stop words,
or an empty field in the data), so its mask is True everywhere: every attention score of that
row is -inf, and the softmax of a row of -inf is 0 / 0 = NaN. The NaN spreads through the
mean and the head into the loss at the very first step.

GradScope should report: step 0, first NaN in the forward pass, module ``encoder.attention``
(the ``nn.MultiheadAttention``, not the ``encoder.embed`` layer before it), output, op
``F.multi_head_attention_forward`` at the ``self.attention(...)`` line of
``Encoder.forward``, with a hint about all-masked rows and ``key_padding_mask``;
``encoder.attention``, ``encoder.attention.out_proj`` and ``head`` "nonfinite" at step 0 and
the run halted there. ``encoder.embed`` stays "ok": the NaN gradient only flows back to the
empty example's tokens, all padding, whose embedding row ``padding_idx`` keeps out of training.
Fix: drop empty examples, or keep at least one key unmasked (e.g. a [CLS] token that is never
padding).
"""

import torch
from torch import nn

CONFIG = {"steps": 10, "batch_size": 8, "optimizer": "adam", "lr": 1e-3}

VOCAB = 100
LENGTH = 10
DIM = 16
PAD = 0


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.attention = nn.MultiheadAttention(DIM, num_heads=2, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == PAD
        x = self.embed(tokens)
        context, _ = self.attention(x, x, x, key_padding_mask=padding)
        return context.mean(dim=1)


class SentenceClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(DIM, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(tokens))


def build_model() -> nn.Module:
    return SentenceClassifier()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, VOCAB, (batch_size, LENGTH), device=device)
    lengths = torch.randint(1, LENGTH + 1, (batch_size,), device=device)
    lengths[-1] = 0  # an empty text
    tokens[torch.arange(LENGTH, device=device)[None, :] >= lengths[:, None]] = PAD
    labels = torch.randint(0, 2, (batch_size,), device=device)
    return tokens, labels
