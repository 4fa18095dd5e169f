"""Unit-test fixtures: the embedded test model, loaded once per module."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer


@pytest.fixture(scope="module")
def lm(model_dir: str) -> tuple[Any, Any]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    return model, tok
