"""Test configuration for the whole suite: headless Qt, small deterministic torch."""

import os
import sys
from pathlib import Path

# Before anything imports Qt: no display in CI.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

TESTS = Path(__file__).parent
REPO = TESTS.parent
MODELS = TESTS / "models"


@pytest.fixture(autouse=True)
def _few_threads():
    import torch

    torch.set_num_threads(2)
    yield


@pytest.fixture
def models_dir() -> Path:
    return MODELS


@pytest.fixture
def write_script(tmp_path):
    """Write a model script into a temporary folder and return its path."""

    def write(text: str, name: str = "model.py") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def pytest_report_header(config):
    return f"python {sys.version.split()[0]}"
