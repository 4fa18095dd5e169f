"""The embedded model builder: build `micro` once, then check what the serving code relies on."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
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
from services.model.corpus import QUOTE_WORDS, quote_passages, quote_prompt
from services.model.presets import PRESETS
from services.model.train import (
    COPY_RUN,
    copy_batch,
    graft,
    make_model,
    quote_batch,
    quote_rows,
    take_weights,
    train,
    train_copy,
)

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


def test_a_build_of_other_sizes_is_built_again(built: Built) -> None:
    """A preset whose sizes changed, its step counts not, does not reuse the old build."""
    micro = PRESETS["micro"]
    for change in (
        {"num_layers": micro.num_layers - 1},
        {"num_heads": micro.num_heads * 2},  # the same parameters, in other heads
        {"intermediate_size": micro.intermediate_size + 64},
        {"max_positions": micro.max_positions * 2},
    ):
        assert not is_ready(built.folder, dataclasses.replace(micro, **change)), change
    assert is_ready(built.folder, micro)


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
    with pytest.raises(ValueError, match="init_from is for distillation or a tune"):
        dataclasses.replace(micro, init_from="micro")
    draft, tiny = PRESETS["small-draft"], PRESETS["tiny"]
    assert (draft.distill_from, draft.init_from) == ("small", "tiny")
    # tiny's widths, fewer of its layers: a draft pass costs per layer.
    widths = ("hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size")
    assert all(getattr(draft, w) == getattr(tiny, w) for w in widths)
    assert draft.num_layers < tiny.num_layers


def test_a_shallower_model_starts_from_the_first_layers_of_a_deeper_one() -> None:
    micro = PRESETS["micro"]
    deep = make_model(dataclasses.replace(micro, seed=3), eot_id=0)
    shallow = make_model(dataclasses.replace(micro, num_layers=2, seed=4), eot_id=0)
    take_weights(deep, shallow)
    theirs = deep.state_dict()
    for name, value in shallow.state_dict().items():
        assert torch.equal(value, theirs[name]), name
    assert len(shallow.model.layers) == 2
    # The same depth takes everything; a deeper model or other widths are refused.
    same = make_model(dataclasses.replace(micro, seed=5), eot_id=0)
    take_weights(deep, same)
    assert all(torch.equal(v, theirs[k]) for k, v in same.state_dict().items())
    with pytest.raises(ValueError, match="cannot start"):
        take_weights(shallow, deep)
    wider = make_model(dataclasses.replace(micro, intermediate_size=256), eot_id=0)
    with pytest.raises(RuntimeError, match="size mismatch"):
        take_weights(deep, wider)


def test_copy_rows_repeat_a_run_and_mark_what_copying_predicts() -> None:
    """Every row repeats one run to its end; a marked position's next token is the token
    one run earlier, and the positions before the repeat begins are never marked."""
    rows, known = copy_batch(torch.Generator().manual_seed(0), 16, 128, 1024)
    assert rows.shape == known.shape == (16, 128) and int(rows.min()) >= 1
    for row, marks in zip(rows.tolist(), known.tolist(), strict=True):
        _assert_repeats_to_end(row, marks)


def _assert_repeats_to_end(row: list[int], marks: list[bool]) -> None:
    first = marks.index(True)  # where the repeat begins: the run's start plus length
    assert all(marks[first:-1]) and not marks[-1] and not any(marks[:first])
    periods = [
        n
        for n in range(COPY_RUN[0], COPY_RUN[1] + 1)
        if 0 <= first - n <= 8 and all(row[p] == row[p - n] for p in range(first, len(row)))
    ]
    assert periods, row


def test_a_grafted_model_starts_as_its_shallow_model() -> None:
    """The copy phase's shallow model grafted into the full depth computes the same
    logits: the later layers add nothing until training moves them."""
    micro = PRESETS["micro"]
    shallow = make_model(dataclasses.replace(micro, num_layers=2, seed=3), eot_id=0)
    deep = make_model(micro, eot_id=0)
    graft(shallow, deep)
    ids = torch.randint(0, micro.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(deep(input_ids=ids).logits, shallow(input_ids=ids).logits)


def test_a_copy_phase_runs_before_the_corpus_and_is_part_of_the_recipe(
    built: Built, tmp_path: Path
) -> None:
    micro = PRESETS["micro"]
    copying = dataclasses.replace(micro, name="micro-copy", copy_steps=3)
    info = model_build.build_model(copying, tmp_path / "m", log=lambda _: None)
    assert (info["copy_step_limit"], info["copy_steps"]) == (3, 3)
    assert info["copy_final_loss"] > 0 and "copy_s" in info["timings"]
    assert is_ready(tmp_path / "m", copying)
    assert not is_ready(tmp_path / "m", dataclasses.replace(copying, copy_steps=4))
    assert not is_ready(built.folder, copying)  # the same steps without the copy phase
    with pytest.raises(ValueError, match="copy_layers"):
        dataclasses.replace(micro, copy_steps=3, copy_layers=micro.num_layers)


def test_the_copy_phase_trains_attention_and_leaves_the_mlps_silent() -> None:
    """The MLPs sit the copy phase out (untouched) and come back writing nothing, so the
    shallow model computes what the phase taught it; attention and embeddings learned."""
    micro = dataclasses.replace(PRESETS["micro"], copy_steps=3)
    shallow = make_model(dataclasses.replace(micro, num_layers=2, copy_steps=0), eot_id=0)
    before = {name: value.clone() for name, value in shallow.state_dict().items()}
    train_copy(shallow, micro, lambda _: None, threads=1)
    after = shallow.state_dict()
    for i, layer in enumerate(shallow.model.layers):
        assert type(layer.mlp).__name__ == "LlamaMLP"
        assert not layer.mlp.down_proj.weight.any()
        for part in ("gate_proj", "up_proj"):
            name = f"model.layers.{i}.mlp.{part}.weight"
            torch.testing.assert_close(after[name], before[name])
        name = f"model.layers.{i}.self_attn.q_proj.weight"
        assert not torch.equal(after[name], before[name])
    assert not torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])


def test_copy_rows_beside_the_corpus_leave_its_order_and_its_loss_figures() -> None:
    """Copy rows add their loss to each step, but the losses reported are the corpus's and
    the corpus batches are the same ones: the first step's loss (before any update) is
    equal with and without them, and the later ones move."""
    micro = dataclasses.replace(PRESETS["micro"], train_steps=6)
    data = torch.randint(
        0, micro.vocab_size, (32, micro.seq_len), generator=torch.Generator().manual_seed(2)
    )
    runs = [
        train(make_model(micro, eot_id=0), data, micro, lambda _: None, threads=1, copy_rows=rows)
        for rows in (0, 2)
    ]
    assert runs[0].losses[0] == pytest.approx(runs[1].losses[0], rel=1e-6)
    assert runs[0].losses[1:] != runs[1].losses[1:]


def test_quote_passages_are_runs_of_whole_words_of_the_texts() -> None:
    texts = ["too short to quote", " ".join(f"w{i}" for i in range(100)), "a  b\tc\n" * 5]
    passages = quote_passages(texts, random.Random(0), 200)
    assert passages == quote_passages(texts, random.Random(0), 200)  # seeded
    lengths = set()
    for passage in passages:
        words = passage.split(" ")
        lengths.add(len(words))
        assert QUOTE_WORDS[0] <= len(words) <= QUOTE_WORDS[1]
        source = next(t.split() for t in texts if words[0] in t.split())
        start = source.index(words[0])
        assert source[start : start + len(words)] == words, passage
    assert min(lengths) < 15 and max(lengths) > 40  # the lengths spread over the range
    assert {"a b c a b c a b c a"} <= {p[:19] for p in passages}  # white space made single
    with pytest.raises(ValueError, match="no text"):
        quote_passages(["short"], random.Random(0), 1)


def test_quote_rows_mark_the_answer_and_its_end_and_never_the_padding(built: Built) -> None:
    """A quote row is the prompt's tokens then the answer's, as a server tokenizes them;
    ``known`` marks the positions whose next token is the answer's (its EOT included),
    the rows are padded on the right, and a padded row predicts as its unpadded self."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(built.folder / "tokenizer.json"))
    tok = AutoTokenizer.from_pretrained(built.folder)
    passages = ["a short passage of words to repeat here", "another, longer passage: " * 4]
    prompts = [quote_prompt(p) for p in passages]
    quotes = quote_rows(prompts, [f" {p}" for p in passages], backend, eot_id=0)
    for quote, prompt, passage in zip(quotes, prompts, passages, strict=True):
        assert quote.ids[: quote.answer] == tok(prompt)["input_ids"]
        assert tok.decode(quote.ids[quote.answer : -1]) == f" {passage}"
        assert quote.ids[-1] == 0
    rows, known = quote_batch(torch.Generator().manual_seed(1), quotes, 6)
    assert rows.shape[0] == known.shape[0] == 6
    assert rows.shape[1] == max(len(q.ids) for q in quotes)
    seen = set()
    for row, marks in zip(rows.tolist(), known.tolist(), strict=True):
        quote = next(q for q in quotes if row[: len(q.ids)] == q.ids)
        seen.add(quote.answer)
        first, last = marks.index(True), len(marks) - 1 - marks[::-1].index(True)
        assert (first, last) == (quote.answer - 1, len(quote.ids) - 2)
        assert all(marks[first : last + 1])
        assert row[len(quote.ids) :] == [0] * (len(row) - len(quote.ids))
    assert len(seen) == 2  # both rows picked
    model = make_model(PRESETS["micro"], eot_id=0).eval()
    shortest = min(quotes, key=lambda q: len(q.ids))
    padded = rows[[r[: len(shortest.ids)] == shortest.ids for r in rows.tolist()].index(True)]
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([shortest.ids])).logits[0]
        inside = model(input_ids=padded[None]).logits[0, : len(shortest.ids)]
    assert torch.allclose(alone, inside, atol=1e-5)


def test_a_copy_tune_follows_the_corpus_and_is_part_of_the_recipe(
    built: Built, tmp_path: Path
) -> None:
    micro = PRESETS["micro"]
    tuned = dataclasses.replace(micro, name="micro-tune", copy_steps=3, tune_steps=4)
    info = model_build.build_model(tuned, tmp_path / "m", log=lambda _: None)
    assert info["tune_steps"] == 4 and "tune_s" in info["timings"]
    assert info["tune_final_loss"] > 0 and 0 <= info["copied_after_tune"] <= 1
    assert is_ready(tmp_path / "m", tuned)
    assert not is_ready(tmp_path / "m", dataclasses.replace(tuned, tune_steps=5))
    assert not is_ready(tmp_path / "m", dataclasses.replace(tuned, tune_steps=0))
    # A build from before tunes were recorded had none.
    plain = read_build_info(built.folder)
    del plain["tune_steps"]
    (tmp_path / "old").mkdir()
    shutil.copy(built.folder / "config.json", tmp_path / "old")
    (tmp_path / "old" / INFO_FILE).write_text(json.dumps(plain), encoding="utf-8")
    assert is_ready(tmp_path / "old", micro)
    with pytest.raises(ValueError, match="copy phase"):
        dataclasses.replace(micro, tune_steps=3)


def test_a_tune_of_a_built_preset_starts_from_its_weights_and_records_its_recipe(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """small-copy's shape: no training of its own, the base's weights tuned. The tune
    moves them, and a change to the base's recipe makes the tuned build stale."""
    tuned = dataclasses.replace(
        PRESETS["micro"], name="micro-tuned", train_steps=0, init_from="micro", tune_steps=3
    )
    info = model_build.build_model(tuned, tmp_path / "m", log=lambda _: None, cache_dir=built.cache)
    assert info["base"] == model_build.recipe(PRESETS["micro"])
    assert info["initialized_from"] == "micro" and "train_s" not in info["timings"]
    assert "tune_s" in info["timings"] and info["samples"]["greedy"]
    base = load_file(built.folder / "model.safetensors")
    ours = load_file(tmp_path / "m" / "model.safetensors")
    assert base.keys() == ours.keys()
    assert not torch.equal(
        base["model.layers.0.self_attn.q_proj.weight"],
        ours["model.layers.0.self_attn.q_proj.weight"],
    )
    assert is_ready(tmp_path / "m", tuned)
    monkeypatch.setitem(PRESETS, "micro", dataclasses.replace(PRESETS["micro"], train_steps=21))
    assert not is_ready(tmp_path / "m", tuned)
    small_copy = PRESETS["small-copy"]
    assert (small_copy.init_from, small_copy.trained) == ("small", False)
    assert small_copy.parameter_count == PRESETS["small"].parameter_count


def test_a_distilled_build_is_stale_once_its_teachers_recipe_changes(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """small-draft learns small's distributions: a draft distilled from a small built by
    another recipe is built again, not served as a draft of the small there is now."""
    folder = tmp_path / "draft"
    shutil.copytree(built.folder, folder)
    # small-draft's recipe in the sizes of the micro build standing in for it.
    micro = PRESETS["micro"]
    sizes = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
    draft = dataclasses.replace(
        PRESETS["small-draft"],
        vocab_size=micro.vocab_size,
        max_positions=micro.max_positions,
        **{size: getattr(micro, size) for size in sizes},
    )
    info = read_build_info(folder)
    info.update(model_build.recipe(draft))
    (folder / INFO_FILE).write_text(json.dumps(info), encoding="utf-8")
    assert is_ready(folder, draft)
    changed = dataclasses.replace(PRESETS["small"], copy_steps=PRESETS["small"].copy_steps + 1)
    monkeypatch.setitem(PRESETS, "small", changed)
    assert not is_ready(folder, draft)
    # A build from before teachers were recorded counts as another recipe.
    del info["teacher"]
    (folder / INFO_FILE).write_text(json.dumps(info), encoding="utf-8")
    monkeypatch.undo()
    assert not is_ready(folder, draft)


def test_comment_passages_are_the_comment_blocks_and_never_a_docstring(tmp_path: Path) -> None:
    from services.model.corpus import build_corpus, iter_comment_passages

    (tmp_path / "mod.py").write_text(
        '"""The module\'s docstring."""\n'
        "# First block,\n#   second line.\n#\n# After an empty comment.\n"
        "x = 1  # a trailing comment is code's, not a block\n"
        "\n# Alone.\n"
        "def f():\n"
        '    """f\'s docstring."""\n'
        "    # Indented block\n    # of two lines.\n"
        "    s = '# inside a string'\n"
        "    return s\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("# a test suite's comment\n")
    (tmp_path / "broken.py").write_text("# Before the error.\ndef (:\n    '''unterminated\n")
    passages = list(iter_comment_passages(tmp_path))
    # Not the test suite's, nor anything of a file that fails to tokenize.
    assert passages == [
        "First block, second line.",
        "After an empty comment.",
        "Alone.",
        "Indented block of two lines.",
    ]
    corpus = "\n".join(build_corpus(10_000, tmp_path))
    assert "docstring" in corpus and not any(p in corpus for p in passages)
