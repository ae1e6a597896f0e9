"""Bad data, not a bad model: one row of the dataset has a missing value read as NaN.

A small regression model predicts house prices from eight numeric features. The table was
loaded from a CSV file in which two rows have an empty ``lot_size`` cell; the parser turned
them into NaN and nothing checked. Most batches never draw those rows and train normally;
the first batch that draws one makes the prediction, the loss and every gradient NaN. The
model, the learning rate and the loss are fine: the fault is in the data.

GradScope should report: healthy steps, then at step 10 [3–40] a **NaN already in the input**:
phase ``input``, no module, tensor ``inputs`` (the features tensor), kind NaN, one NaN in one
sample of the batch, its position (sample index first, then feature 3, ``lot_size``), and a
hint about the data (find the sample, filter or repair it in the dataset, ``torch.nan_to_num``
only as a stopgap); every layer "nonfinite" at that step and the run halted there.
Fix: drop or impute the rows with missing values when the table is loaded
(``table = table[torch.isfinite(table).all(dim=1)]``).
"""

import torch
from torch import nn

CONFIG = {"steps": 60, "batch_size": 16, "optimizer": "adam", "lr": 1e-2}

FEATURES = ["rooms", "age", "distance", "lot_size", "floor", "tax", "income", "crime"]
ROWS = 400
MISSING_ROWS = (57, 311)
LOT_SIZE = FEATURES.index("lot_size")


def _load_table() -> tuple[torch.Tensor, torch.Tensor]:
    """The table as the CSV reader left it (a fixed generator: the same table every run)."""
    generator = torch.Generator().manual_seed(1234)
    features = torch.randn(ROWS, len(FEATURES), generator=generator)
    weights = torch.randn(len(FEATURES), 1, generator=generator)
    prices = features @ weights + 0.1 * torch.randn(ROWS, 1, generator=generator)
    for row in MISSING_ROWS:
        features[row, LOT_SIZE] = float("nan")  # an empty cell in the CSV
    return features, prices


TABLE, PRICES = _load_table()


class PriceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(len(FEATURES), 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(features)))


def build_model() -> nn.Module:
    return PriceModel()


def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.randint(0, ROWS, (batch_size,))
    return TABLE[rows].to(device), PRICES[rows].to(device)
