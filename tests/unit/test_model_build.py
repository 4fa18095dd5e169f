"""The embedded model builder: build `micro` once, then check what the serving code relies on."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.model import build as model_build
from services.model.build import (
    BUILD_VERSION,
    INFO_FILE,
    ensure_model,
    is_ready,
    model_dir_name,
    read_build_info,
)
from services.model.chat import render_chat
from services.model.presets import PRESETS

MULTIBYTE = "Héllo wörld: café, 中文 and an emoji 😀 — tabs\tand  spaces.\n"


class Built:
    """One `micro` build shared by the tests of this module (it takes a few seconds)."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.logs: list[str] = []
        self.folder = ensure_model("micro", cache, log=self.logs.append)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def tokenizer(built: Built) -> Any:
    return AutoTokenizer.from_pretrained(built.folder)


@pytest.fixture(scope="module")
def model(built: Built) -> Any:
    return AutoModelForCausalLM.from_pretrained(built.folder)


def test_folder_is_named_by_preset_and_version_and_complete(built: Built) -> None:
    assert built.folder == built.cache / model_dir_name("micro")
    assert "micro" in built.folder.name and BUILD_VERSION in built.folder.name
    for name in ("config.json", "model.safetensors", "tokenizer.json", INFO_FILE):
        assert (built.folder / name).is_file(), name
    # Nothing half-built is left next to it: only the model and its lock file.
    assert sorted(p.name for p in built.cache.iterdir()) == [
        f".{built.folder.name}.lock",
        built.folder.name,
    ]
    assert any("building" in line for line in built.logs)


def test_second_call_reuses_the_build(built: Built) -> None:
    info_file = built.folder / INFO_FILE
    before = (built.folder.stat().st_mtime_ns, info_file.stat().st_mtime_ns)
    logs: list[str] = []
    assert ensure_model("micro", built.cache, log=logs.append) == built.folder
    assert not any("building" in line for line in logs), logs
    assert (built.folder.stat().st_mtime_ns, info_file.stat().st_mtime_ns) == before


def test_parameter_count(built: Built, model: Any) -> None:
    count = sum(p.numel() for p in model.parameters())
    assert 100_000 <= count <= 900_000
    assert count == PRESETS["micro"].parameter_count == read_build_info(built.folder)["parameters"]
    assert model.config.tie_word_embeddings
    assert model.dtype == torch.float32


def test_preset_sizes() -> None:
    assert 1_500_000 <= PRESETS["tiny"].parameter_count <= 2_500_000
    assert 25_000_000 <= PRESETS["small"].parameter_count <= 35_000_000
    assert all(PRESETS[name].trained for name in ("micro", "tiny", "small"))
    # The GPU's bandwidth check: a 1B Llama's shapes, never trained.
    assert not PRESETS["llama-1b"].trained
    assert 0.9e9 <= PRESETS["llama-1b"].parameter_count <= 1.1e9
    # small is tiny's draft target: the same corpus, hence the same tokenizer.
    tiny, small = PRESETS["tiny"], PRESETS["small"]
    assert (tiny.vocab_size, tiny.corpus_bytes) == (small.vocab_size, small.corpus_bytes)


def test_a_build_of_another_step_count_is_built_again(built: Built, tmp_path: Path) -> None:
    """A cached build whose preset has since changed its training length is not reused."""
    assert is_ready(built.folder, PRESETS["micro"])
    changed = dataclasses.replace(PRESETS["micro"], train_steps=PRESETS["micro"].train_steps + 1)
    assert not is_ready(built.folder, changed)
    assert is_ready(built.folder)  # finished, whichever recipe
    assert not is_ready(tmp_path)


def test_tokenizer_round_trips_multibyte_text(tokenizer: Any) -> None:
    ids = tokenizer.encode(MULTIBYTE, add_special_tokens=False)
    assert tokenizer.decode(ids) == MULTIBYTE
    assert len(tokenizer) <= PRESETS["micro"].vocab_size


def test_special_tokens_agree_with_model(tokenizer: Any, model: Any) -> None:
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.eos_token_id == tokenizer.bos_token_id == tokenizer.pad_token_id == eot
    generation = model.generation_config
    assert generation.eos_token_id == generation.bos_token_id == generation.pad_token_id == eot
    assert model.config.eos_token_id == eot


def test_chat_template(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Qu'est-ce que 中文?"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|system|>\nBe brief.\n<|user|>\nQu'est-ce que 中文?\n<|assistant|>\n"
    assert text == render_chat(messages, add_generation_prompt=True)
    without = tokenizer.apply_chat_template(messages, tokenize=False)
    assert without == render_chat(messages, add_generation_prompt=False)
    assert not without.endswith("<|assistant|>\n")
    # Role markers are single special tokens, dropped when decoding generated text.
    ids = tokenizer.encode(text, add_special_tokens=False)
    marker_ids = tokenizer.convert_tokens_to_ids(["<|system|>", "<|user|>", "<|assistant|>"])
    assert [i for i in ids if i in marker_ids] == marker_ids
    assert tokenizer.decode(ids) == text
    assert "<|" not in tokenizer.decode(ids, skip_special_tokens=True)
    with pytest.raises(Exception, match="unsupported chat role"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_generate_produces_tokens(tokenizer: Any, model: Any) -> None:
    prompt = tokenizer("The function returns", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 8)
    assert isinstance(tokenizer.decode(out[0]), str)


def test_build_is_deterministic(built: Built, tmp_path: Path) -> None:
    again = ensure_model("micro", tmp_path, log=lambda _line: None)
    assert (again / "tokenizer.json").read_bytes() == (built.folder / "tokenizer.json").read_bytes()
    first, second = (
        load_file(built.folder / "model.safetensors"),
        load_file(again / "model.safetensors"),
    )
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_interrupted_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(spec: object, out_dir: Path, *, log: object, cache_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")  # a half-written model
        raise KeyboardInterrupt

    monkeypatch.setattr(model_build, "build_model", explode)
    with pytest.raises(KeyboardInterrupt):
        ensure_model("micro", tmp_path, log=lambda _line: None)
    assert [p.name for p in tmp_path.iterdir()] == [f".{model_dir_name('micro')}.lock"]


def test_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="unknown model preset"):
        ensure_model("huge", tmp_path)


def test_an_existing_build_gets_the_current_chat_template(tmp_path: Path) -> None:
    from services.model.chat import CHAT_TEMPLATE

    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    model_build.refresh_chat_template(tmp_path)
    assert (tmp_path / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert [p.name for p in tmp_path.iterdir()] == ["chat_template.jinja"]
    model_build.refresh_chat_template(tmp_path / "missing")  # no folder: nothing to do


def test_the_template_renders_tools_and_plain_chats_as_the_corpus(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "x"}]
    plain = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert plain == render_chat(messages, add_generation_prompt=True)
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert text.endswith(plain) and '{"name": "get_weather"}' in text


def test_a_distilled_preset_learns_its_teacher(built: Built, tmp_path: Path) -> None:
    """Distillation trains on the teacher's next-token distributions (the loss is the KL
    divergence from them, falling as the student learns); started from the teacher's own
    weights it is zero from the first step."""
    micro = PRESETS["micro"]
    fresh = dataclasses.replace(micro, name="micro-student", seed=5, distill_from="micro")
    info = model_build.build_model(
        fresh, tmp_path / "fresh", log=lambda _: None, cache_dir=built.cache
    )
    assert info["distilled_from"] == "micro" and info["initialized_from"] is None
    assert info["final_loss"] < info["first_loss"]
    same = dataclasses.replace(fresh, train_steps=5, warmup_steps=1, init_from="micro")
    info = model_build.build_model(
        same, tmp_path / "same", log=lambda _: None, cache_dir=built.cache
    )
    assert info["initialized_from"] == "micro"
    assert info["first_loss"] == pytest.approx(0.0, abs=1e-5)
    # The result serves as any build does.
    student = AutoModelForCausalLM.from_pretrained(tmp_path / "same")
    assert student.config.vocab_size == micro.vocab_size


def test_a_distilled_preset_needs_training_and_a_teacher() -> None:
    micro = PRESETS["micro"]
    with pytest.raises(ValueError, match="needs train_steps"):
        dataclasses.replace(micro, train_steps=0, distill_from="micro")
    with pytest.raises(ValueError, match="init_from is for distillation"):
        dataclasses.replace(micro, init_from="micro")
    draft, tiny = PRESETS["small-draft"], PRESETS["tiny"]
    assert (draft.distill_from, draft.init_from) == ("small", "tiny")
    assert draft.parameter_count == tiny.parameter_count
