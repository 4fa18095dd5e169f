"""Unit-test fixtures: the embedded test model, loaded once per module.

The model runs where ``TW_TEST_DEVICE`` says (default ``cpu``) in the precision
``TW_TEST_DTYPE`` says (default ``float32``), loaded through the worker's own loader, so the
engine tests also check the CUDA path and reduced precision on a machine that has a GPU.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from services.worker.loader import load_model

DEVICE = os.environ.get("TW_TEST_DEVICE", "cpu")
DTYPE = os.environ.get("TW_TEST_DTYPE", "float32")


@pytest.fixture(scope="module")
def lm(model_dir: str) -> tuple[Any, Any]:
    return load_model(model_dir, DEVICE, DTYPE)
