"""One rule turns requests into token ids: the batcher routes on the ids a worker's prefix
cache keys (tools included), and loads its tokenizer without transformers or torch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from services.batcher.routing import prefix_hashes
from shared.messages import ChatMessage, GenerateRequest
from shared.prefix_hash import AFFINITY_DEPTH, BLOCK_SIZE, block_hashes
from shared.prompts import (
    PromptTokenizer,
    TemplateError,
    TransformersPrompts,
    load_prompts,
    prompt_token_ids,
)
from tests.conftest import torch_imported_by

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find the current weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHAT = [
    ChatMessage(role="system", content="You answer briefly and only with what you know."),
    ChatMessage(role="user", content="What is the weather like in Paris today? " * 4),
]
REQUESTS = {
    "prompt": GenerateRequest(prompt="The function returns the list of items. " * 60),
    "chat": GenerateRequest(messages=CHAT),
    "chat with tools": GenerateRequest(messages=CHAT, tools=TOOLS),
    "token ids": GenerateRequest(prompt_token_ids=list(range(100))),
}


@pytest.mark.parametrize("name", REQUESTS)
def test_the_batcher_hashes_prompts_as_the_worker_caches_them(model_dir: str, name: str) -> None:
    req = REQUESTS[name]
    tok = AutoTokenizer.from_pretrained(model_dir)
    cached = block_hashes(prompt_token_ids(tok, req), BLOCK_SIZE, AFFINITY_DEPTH)
    assert len(cached) == AFFINITY_DEPTH
    fast = PromptTokenizer.load(model_dir)
    assert fast is not None
    assert prefix_hashes(fast, req, BLOCK_SIZE) == cached
    assert prefix_hashes(TransformersPrompts(tok), req, BLOCK_SIZE) == cached


def test_tools_lead_the_prompt_the_worker_caches(model_dir: str) -> None:
    """Requests sharing a tool list share their leading blocks (what routing keys on), and
    those differ from the same conversation's without tools."""
    fast = PromptTokenizer.load(model_dir)
    assert fast is not None
    other = GenerateRequest(messages=[CHAT[0], ChatMessage(role="user", content="And Rome?")])
    with_tools = prefix_hashes(fast, REQUESTS["chat with tools"], BLOCK_SIZE)
    assert (
        prefix_hashes(fast, other.model_copy(update={"tools": TOOLS}), BLOCK_SIZE)[:2]
        == (with_tools[:2])
    )
    assert prefix_hashes(fast, REQUESTS["chat"], BLOCK_SIZE)[0] != with_tools[0]


def test_a_folder_without_tokenizer_json_is_read_by_transformers(
    model_dir: str, tmp_path: Path
) -> None:
    Tokenizer.from_file(f"{model_dir}/tokenizer.json").model.save(str(tmp_path))  # vocab, merges
    shutil.copy(f"{model_dir}/chat_template.jinja", tmp_path)
    config = json.loads(Path(model_dir, "tokenizer_config.json").read_text())
    config.pop("backend")
    config["tokenizer_class"] = "GPT2Tokenizer"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    slow, fast = load_prompts(tmp_path), load_prompts(model_dir)
    assert isinstance(slow, TransformersPrompts) and isinstance(fast, PromptTokenizer)
    text = "The function returns héllo wörld\n\n  x"
    assert slow.encode(text, special_tokens=False) == fast.encode(text, special_tokens=False)
    msgs = [m.model_dump(exclude_none=True) for m in CHAT]
    assert slow.render_chat(msgs, TOOLS) == fast.render_chat(msgs, TOOLS)


def test_the_batcher_loads_its_tokenizer_without_torch(model_dir: str) -> None:
    code = (
        "import services.cli, services.batcher.service\n"
        "from shared.prompts import load_prompts\n"
        "assert load_prompts(sys.argv[1]).encode('hi', special_tokens=True)"
    )
    assert torch_imported_by(code, model_dir) == []


@pytest.mark.parametrize(
    "source",
    [
        "{{ raise_exception('roles must alternate') }}",
        "{{ messages[0]['content'] + 1 }}",  # a TypeError in the template
        "{{ messages[0]['name']['first'] }}",  # an undefined field looked into
    ],
)
def test_whatever_a_template_raises_is_a_template_error(model_dir: str, source: str) -> None:
    """The edge answers a TemplateError with a 400 naming the messages; anything else a
    template raises would be a 500."""
    fast = PromptTokenizer.load(model_dir)
    assert fast is not None
    strict = PromptTokenizer(fast.tokenizer, fast.template.environment.from_string(source))
    with pytest.raises(TemplateError):
        strict.render_chat([{"role": "user", "content": "hi"}], None)
