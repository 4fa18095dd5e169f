"""The compatibility matrix: a random-weight tiny model of every supported architecture and
attention layout (tests/tiny_models.py), loaded through the worker's own loader, served
exactly by the engine; and what is not supported refused at load.

For each row, with prompts longer than every sliding window:
- the runner's logits, over mixed batches of prefill chunks and decoding rows, equal one
  plain forward pass of the model over the whole sequence (fp32 tolerance);
- greedy generations through the engine (staggered arrivals, prefix-cache hits, a KV
  budget small enough to preempt) are token-identical to ``generate``, one at a time;
- the KV pool has the layout the model's layers produce, and each layer the window its
  config declares.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from services.worker.engine.engine import Engine
from services.worker.engine.layout import SUPPORTED, UnsupportedModel, attention_layout
from services.worker.engine.model_runner import ModelRunner, RunItem
from services.worker.engine.request import Status
from services.worker.engine.wire import EngineConfig, EngineRequest
from services.worker.loader import load_model
from tests.tiny_models import ARCHS, REFUSED, VOCAB, WINDOW, build_tiny, save_tiny, tiny_config
from tests.unit.test_engine import collect, reference

pytestmark = pytest.mark.timeout(600)

BLOCK = 8  # smaller than the window: blocks fall across window edges
NEW = 20
LOGIT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matrix")


def load(name: str, folders: Path, model_dir: str) -> tuple[Any, Any]:
    folder = build_tiny(name, folders / name, model_dir)
    return load_model(str(folder), "cpu", "float32")


def prompt_lengths(arch_context: int, rng: random.Random, n: int) -> list[int]:
    longest = min(6 * WINDOW, arch_context - NEW - 1)
    return [rng.randint(WINDOW + 1, longest) if i % 3 else rng.randint(2, WINDOW) for i in range(n)]


@pytest.mark.parametrize("name", list(ARCHS))
def test_logits_of_mixed_batches_equal_a_plain_forward_pass(
    name: str, folders: Path, model_dir: str
) -> None:
    arch = ARCHS[name]
    model, _ = load(name, folders, model_dir)
    rng = random.Random(11)
    lengths = prompt_lengths(arch.context, rng, 6)
    seqs = [[rng.randrange(3, VOCAB) for _ in range(n + NEW)] for n in lengths]
    per_seq = -(-max(len(s) for s in seqs) // BLOCK)
    groups = len(attention_layout(model.config).groups)  # KV groups: a block table each
    runner = ModelRunner(model, per_seq * len(seqs) * groups, BLOCK)
    with torch.inference_mode():
        want = [model(torch.tensor([s])).logits[0].float() for s in seqs]
    done = [0] * len(seqs)
    worst = 0.0
    steps = 0
    while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
        live = [i for i, s in enumerate(seqs) if done[i] < len(s)]
        pick = rng.sample(live, rng.randint(1, len(live)))
        # A decode, a prefill chunk, or a verification (speculation's: a few tokens per
        # decoding row, logits at every position, over the decode rows' KV).
        kind = rng.choice(["decode", "prefill", "verify"])
        items = []
        for i in pick:
            n = {"decode": 1, "prefill": rng.randint(1, 24), "verify": rng.randint(1, 5)}[kind]
            n = min(n, len(seqs[i]) - done[i])
            tables = [
                list(range((i * groups + g) * per_seq, (i * groups + g + 1) * per_seq))
                for g in range(groups)
            ]
            key = (i, 0) if kind != "prefill" or n == 1 else None
            blocks = tables if groups > 1 else tables[0]
            items.append(RunItem(seqs[i][done[i] : done[i] + n], done[i], blocks, key))
        got = runner.forward(items, every_position=kind == "verify")
        for row, (i, it) in enumerate(zip(pick, items, strict=True)):
            for t in range(len(it.token_ids)) if kind == "verify" else [len(it.token_ids) - 1]:
                at = it.start + t
                ours = got[row, t] if kind == "verify" else got[row]
                diff = (ours - want[i][at]).abs().max().item()
                worst = max(worst, diff)
                assert diff < LOGIT_TOLERANCE, f"{name}: seq {i} position {at} off by {diff}"
            done[i] += len(it.token_ids)
        steps += 1
    print(f"{name}: {steps} passes, largest logit difference {worst:.2e}")


@pytest.mark.parametrize("name", list(ARCHS))
def test_greedy_through_the_engine_equals_generate(
    name: str, folders: Path, model_dir: str
) -> None:
    arch = ARCHS[name]
    model, tok = load(name, folders, model_dir)
    rng = random.Random(12)
    shared = [rng.randrange(3, VOCAB) for _ in range(2 * WINDOW + 3)]
    prompts = []
    for i, n in enumerate(prompt_lengths(arch.context, rng, 9)):
        own = [rng.randrange(3, VOCAB) for _ in range(n)]
        prompts.append((shared + own)[: arch.context - NEW - 1] if i % 2 else own)
    windowed = None not in arch.windows  # blocks behind the window are released
    engine = Engine(
        model,
        tok,
        EngineConfig(
            # A few sequences at a time: preemptions.
            kv_budget_tokens=(12 if windowed else 36) * BLOCK,
            block_size=BLOCK,
            prefill_chunk=24,
            max_step_tokens=64,
            max_running=6,
        ),
    )
    outputs = []
    for i, p in enumerate(prompts):  # a new request joins at every step
        engine.add_request(EngineRequest(f"r{i}", p, max_tokens=NEW, ignore_eos=True))
        outputs += engine.step()
    tokens, finals = collect(outputs + engine.run_until_idle())
    same = sum(tokens[f"r{i}"] == reference(model, p, NEW) for i, p in enumerate(prompts))
    runner = engine.runner
    print(
        f"{name}: {same}/{len(prompts)} identical, {engine.stats.preemptions} preemptions, "
        f"{engine.stats.prefix_hit_tokens} prefix-hit tokens, "
        f"{runner.bytes_per_token} KV bytes/token"
    )
    for i, p in enumerate(prompts):
        assert tokens[f"r{i}"] == reference(model, p, NEW), f"{name}: request {i} ({len(p)})"
        assert finals[f"r{i}"].finish is Status.FINISHED_LENGTH
    assert engine.stats.preemptions > 0 and engine.stats.prefix_hit_tokens > 0
    # The layout the layers produce and the windows the config declares.
    kv_heads, head_dim, layers = arch.kv
    assert runner.layout.windows == arch.windows
    assert len(runner.k_pool) == len(runner.v_pool) == layers
    assert runner.k_pool[0].shape[2:] == (kv_heads, head_dim)
    per_layer = 2 * kv_heads * head_dim * 4  # fp32 keys and values of one token
    # Interleaved sliding and full layers: a token costs only the full layers for good
    # (the sliding ones hold a window), and a block holds one group's layers.
    mixed = len(set(arch.windows)) > 1
    kept = arch.windows.count(None) if mixed and None in arch.windows else layers
    per_token = per_layer * kept
    assert runner.bytes_per_token == engine.stats.kv_bytes_per_token == per_token
    group = len(runner.layout.groups[0])
    assert runner.block_bytes == per_layer * group * BLOCK
    assert engine.max_context == arch.context
    sized = Engine(model, tok, EngineConfig(kv_budget_bytes=1 << 20, block_size=BLOCK))
    assert sized.stats.kv_blocks == (1 << 20) // (per_layer * group * BLOCK)


@pytest.mark.parametrize("name", [n for n, a in ARCHS.items() if None not in a.windows])
def test_a_sequence_of_a_sliding_window_model_holds_a_window_of_blocks(
    name: str, folders: Path, model_dir: str
) -> None:
    """Every layer slides: blocks behind the window are released as the sequence moves on,
    so a request many windows long holds about a window of KV (the rest is never read)."""
    arch = ARCHS[name]
    model, tok = load(name, folders, model_dir)
    rng = random.Random(14)
    prompt = [rng.randrange(3, VOCAB) for _ in range(arch.context - 4 * NEW)]
    new, chunk = 3 * NEW, 24
    engine = Engine(
        model, tok, EngineConfig(kv_budget_tokens=64 * BLOCK, block_size=BLOCK, prefill_chunk=chunk)
    )
    engine.add_request(EngineRequest("long", prompt, max_tokens=new, ignore_eos=True))
    tokens, _ = collect(engine.run_until_idle())
    assert tokens["long"] == reference(model, prompt, new)
    # A window behind the first uncomputed position, plus the chunk, plus partial blocks.
    bound = -(-(WINDOW - 1 + chunk) // BLOCK) + 1
    full = -(-(len(prompt) + new) // BLOCK)
    print(
        f"{name}: {len(prompt) + new} tokens held at most {engine.stats.kv_peak_used_blocks} "
        f"blocks of {BLOCK} (whole history: {full})"
    )
    assert engine.stats.kv_peak_used_blocks <= bound < full


INTERLEAVED = [n for n, a in ARCHS.items() if None in a.windows and len(set(a.windows)) > 1]


@pytest.mark.parametrize("name", INTERLEAVED)
def test_sliding_layers_of_an_interleaved_model_cost_only_their_window(
    name: str, folders: Path, model_dir: str
) -> None:
    """The bytes of 16 blocks of every layer (one table for all layers: 16 * BLOCK tokens
    at most) hold, as KV groups, the full groups' blocks for the whole request and each
    sliding group's window of blocks: exactly the longest request that arithmetic allows is
    admitted and served exactly, one token more is refused."""
    arch = ARCHS[name]
    model, tok = load(name, folders, model_dir)
    kv_heads, head_dim, layers = arch.kv
    per_layer = 2 * kv_heads * head_dim * 4  # fp32 keys and values of one token
    budget, chunk = 16 * BLOCK * per_layer * layers, 24
    config = EngineConfig(kv_budget_bytes=budget, block_size=BLOCK, prefill_chunk=chunk)
    engine = Engine(model, tok, config)
    groups = engine.runner.layout.groups
    blocks = budget // (per_layer * len(groups[0]) * BLOCK)
    assert engine.stats.kv_blocks == blocks
    full = sum(1 for g in groups if arch.windows[g[0]] is None)
    sliding = len(groups) - full
    window_blocks = -(-(WINDOW - 1 + chunk) // BLOCK) + 1
    longest = (blocks - sliding * window_blocks) // full * BLOCK
    print(
        f"{name}: {longest} tokens admitted, {16 * BLOCK} in one table ({longest / (16 * BLOCK):.2f}x)"
    )
    assert longest > 16 * BLOCK
    # The heartbeat's free tokens: what a new request surely gets (a slot in every group).
    assert engine.stats.free_kv_tokens == blocks * BLOCK // len(groups) <= longest
    rng = random.Random(15)
    prompt = [rng.randrange(3, VOCAB) for _ in range(longest - NEW)]
    engine.add_request(EngineRequest("longest", prompt, max_tokens=NEW, ignore_eos=True))
    engine.add_request(EngineRequest("over", [*prompt, 5], max_tokens=NEW, ignore_eos=True))
    tokens, finals = collect(engine.run_until_idle())
    assert "KV budget" in (finals["over"].error or "")
    assert tokens["longest"] == reference(model, prompt, NEW)
    held = -(-longest // BLOCK) * full + window_blocks * sliding
    assert engine.stats.kv_peak_used_blocks <= held <= blocks


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_cannot_be_served_exactly_is_refused_at_load(
    name: str, tmp_path: Path, model_dir: str
) -> None:
    model_type, overrides, feature = REFUSED[name]
    tiny_config(model_type, overrides).save_pretrained(tmp_path)  # no weights: refused before
    with pytest.raises(UnsupportedModel, match=feature) as refused:
        load_model(str(tmp_path), "cpu", "float32")
    assert model_type in str(refused.value)


def test_every_eos_id_of_the_generation_config_ends_a_request(
    tmp_path: Path, model_dir: str
) -> None:
    """Several EOS ids (as Llama 3 has): whichever the model emits ends its request, as it
    ends ``generate``."""
    config = tiny_config("llama", {"num_key_value_heads": 2})
    model, _ = load_model(str(save_tiny(config, tmp_path / "plain", model_dir)), "cpu", "float32")
    rng = random.Random(13)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(20)] for _ in range(3)]
    free = [reference(model, p, NEW) for p in prompts]
    # One EOS id from each generation (at a different step), and one never emitted.
    eos = sorted({free[0][3], free[1][7], free[2][12]} | {VOCAB - 1})
    config.eos_token_id = eos
    folder = save_tiny(config, tmp_path / "eos", model_dir)
    model, tok = load_model(str(folder), "cpu", "float32")
    assert model.generation_config.eos_token_id == eos
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=4096, block_size=BLOCK))
    assert engine.eos_ids == frozenset(eos)
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", p, max_tokens=NEW))
    tokens, finals = collect(engine.run_until_idle())
    for i, p in enumerate(prompts):
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([p]), max_new_tokens=NEW, do_sample=False, eos_token_id=eos
            )
        want = out[0, len(p) :].tolist()
        assert want[-1] in eos and len(want) < NEW
        assert tokens[f"r{i}"] == want, f"request {i}"
        assert finals[f"r{i}"].finish is Status.FINISHED_STOPPED


def test_the_matrix_covers_every_supported_type_and_the_readme_lists_them() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert {a.model_type for a in ARCHS.values()} == set(SUPPORTED)
    for model_type, what in SUPPORTED.items():
        assert f"| `{model_type}` | {what} |" in readme, model_type
