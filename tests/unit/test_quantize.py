"""int8 weights (``TW_QUANTIZE=int8``): every linear layer quantized, the engine batched
equal to the quantized model's own ``generate`` one request at a time (quantization changes
the model, not the engine's exactness), and refused off the CPU."""

from __future__ import annotations

import random

import pytest
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from services.worker.engine.engine import Engine
from services.worker.engine.wire import EngineConfig, EngineRequest
from services.worker.loader import load_model
from tests.unit.test_engine import collect, random_ids, reference

pytestmark = pytest.mark.timeout(600)


def test_int8_engine_matches_the_quantized_model_and_stays_close_to_fp32(
    model_dir: str,
) -> None:
    model, tok = load_model(model_dir, "cpu", "float32", "int8")
    full, _ = load_model(model_dir, "cpu", "float32")
    linears = sum(isinstance(m, torch.nn.Linear) for m in full.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert sum(isinstance(m, DynamicInt8Linear) for m in model.modules()) == linears > 0

    rng = random.Random(7)
    prompts = [random_ids(rng, rng.randint(4, 120), model.config.vocab_size) for _ in range(6)]
    new = 16
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=4096))
    assert engine.runner._direct is None  # quantized layers: the model's own forward
    # One request at a time: a dynamically quantized layer takes one activation scale for
    # its whole input, so rows batched together round each other (on some CPUs' kernels a
    # greedy token flips); alone, a request's steps are the reference's.
    got: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", p, max_tokens=new, ignore_eos=True))
        got.update(collect(engine.run_until_idle())[0])
    batched = Engine(model, tok, EngineConfig(kv_budget_tokens=4096))
    for i, p in enumerate(prompts):
        batched.add_request(EngineRequest(f"r{i}", p, max_tokens=new, ignore_eos=True))
    together, _ = collect(batched.run_until_idle())
    same = 0
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == reference(model, p, new), i
        # Batched, the int8 rounding moves with the batch: still mostly full precision's.
        same += sum(a == b for a, b in zip(together[f"r{i}"], reference(full, p, new), strict=True))
    # int8 is not exact: most greedy tokens still agree with full precision.
    assert same >= 0.5 * new * len(prompts), same


def test_int8_is_refused_off_the_cpu(model_dir: str) -> None:
    with pytest.raises(ValueError, match="CPU only"):
        load_model(model_dir, "cuda", "float32", "int8")
    with pytest.raises(ValueError, match="unknown quantization"):
        load_model(model_dir, "cpu", "float32", "int4")
