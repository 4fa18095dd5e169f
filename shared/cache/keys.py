"""Exact-cache keys: a digest of everything that decides a request's output.

A request's output is decided by the model (its weights, tokenizer, chat template and
generation defaults: :func:`model_identity`), its prompt or messages and every other input
field (tools, a grammar, retrieval with the index's version), and its sampling fields. The
key digests the request's own JSON minus the fields that only say who asked, when, and
where answers go; so a field added to the wire later is part of the key by default, and a
cache can never answer a request that differs in it.

Only reproducible answers may be stored: greedy requests (the seed then decides nothing
and is left out of the key) and requests with a seed the client chose. A request that
samples with the seed its id derived is never looked up nor stored.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from shared.messages import FinishReason, GenerateRequest

# Fields that decide nothing about the tokens: identity, timing, delivery, cache control.
_NOT_OUTPUT = frozenset(
    {
        "request_id",
        "created_at",
        "tenant",
        "priority",
        "stream",
        "reply",
        "deadline",
        "cache",
        "cache_store",
    }
)
# Sampling fields that decide nothing about the answer's events. (``logprobs`` decides no
# token, but the stored events carry them or not: it is part of the key.)
_NOT_OUTPUT_SAMPLING: frozenset[str] = frozenset()
# Files of a model folder that decide its output, digested into its identity.
_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_FULL_HASH_LIMIT = 256 << 20  # bigger weight files: size, header and both ends
STORABLE_FINISHES = frozenset({FinishReason.STOP, FinishReason.LENGTH})
# The cache scope of every tenant when tenants share entries (``TW_CACHE_SHARED``).
SHARED_SCOPE = "~shared"  # "~" is never in a tenant id


def is_greedy(req: GenerateRequest) -> bool:
    """Whether the request picks the most likely token at every step."""
    s = req.sampling
    return s.temperature == 0 or s.top_k == 1


def reproducible(req: GenerateRequest, client_seeded: bool) -> bool:
    """Whether the same request always yields the same tokens: greedy, or sampled with a
    seed the client chose (not the one the edge derived from the request id)."""
    return is_greedy(req) or client_seeded


def output_fields(req: GenerateRequest) -> dict[str, Any]:
    """The request's fields that decide its output, as plain JSON data."""
    data = req.model_dump(mode="json", exclude=set(_NOT_OUTPUT))
    sampling = {k: v for k, v in data["sampling"].items() if k not in _NOT_OUTPUT_SAMPLING}
    if is_greedy(req):
        sampling.pop("seed", None)  # greedy: the seed draws nothing
    data["sampling"] = sampling
    return data


def exact_digest(req: GenerateRequest, model: str, extra: dict[str, str] | None = None) -> str:
    """The exact-cache digest of ``req`` for the model identity ``model``; ``extra`` holds
    further inputs the request names but does not contain (a retrieval index's version)."""
    payload = {"model": model, "request": output_fields(req), "extra": extra or {}}
    blob = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=20).hexdigest()


def sampling_class(req: GenerateRequest) -> str:
    """A digest of the sampling fields: a semantic hit needs the same class."""
    fields = output_fields(req)["sampling"]
    blob = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def context_digest(req: GenerateRequest) -> str:
    """A digest of everything but the last user turn (system prompt, earlier turns, tools,
    grammar): a semantic hit needs the same conversation context."""
    fields = output_fields(req)
    fields.pop("sampling", None)
    fields.pop("prompt", None)
    messages = fields.get("messages")
    if messages:
        fields["messages"] = messages[:-1]
    blob = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def last_user_text(req: GenerateRequest) -> str:
    """The text a semantic lookup compares: the prompt, or the last message."""
    if req.messages:
        return req.messages[-1].content
    return req.prompt or ""


def model_identity(model_dir: str | Path, name: str) -> str:
    """A digest of a model folder's files that decide its output (config, generation
    defaults, tokenizer, chat template, weights), with the served name. Weight files over
    256 MB are digested by size, header and both ends, so a large model costs
    milliseconds at start-up; any retrained or swapped file changes those bytes."""
    digest = hashlib.blake2b(name.encode(), digest_size=16)
    folder = Path(model_dir) if model_dir else None
    if folder is None or not folder.is_dir():
        return "name-" + digest.hexdigest()
    names = [n for n in _MODEL_FILES if (folder / n).is_file()]
    names += sorted(p.name for p in folder.iterdir() if p.name.endswith(_WEIGHT_SUFFIXES))
    for fname in names:
        digest.update(b"\0" + fname.encode() + b"\0")
        _digest_file(digest, folder / fname)
    return "model-" + digest.hexdigest()


def _digest_file(digest: Any, path: Path) -> None:
    size = path.stat().st_size
    with path.open("rb") as fh:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
            return
        digest.update(b"%d" % size)
        digest.update(fh.read(1 << 20))
        fh.seek(size - (1 << 20))
        digest.update(fh.read(1 << 20))
