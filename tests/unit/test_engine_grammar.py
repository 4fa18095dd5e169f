"""Grammar-constrained decoding in the engine, on the embedded tiny model: 20 JSON schemas
batched with unconstrained requests. Every constrained output parses and validates against
its schema (``jsonschema_rs``); the unconstrained ones equal their output run alone."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest

from services.worker.engine.engine import Engine
from services.worker.engine.request import Status
from services.worker.engine.wire import EngineConfig, EngineRequest, SamplingConfig, StepOutput

pytestmark = pytest.mark.timeout(300)


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required or list(props)}


NAME = {"type": "string", "maxLength": 8}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}
SCORE = {"type": "number", "minimum": -1, "maximum": 1}
COLOR = {"enum": ["red", "green", "blue"]}

SCHEMAS: list[dict[str, Any]] = [
    _obj({"name": NAME}),
    _obj({"age": AGE}),
    _obj({"ok": {"type": "boolean"}}),
    _obj({"color": COLOR}),
    _obj({"score": SCORE}),
    _obj({"name": NAME, "age": AGE, "ok": {"type": "boolean"}}),
    _obj({"tags": {"type": "array", "items": COLOR, "maxItems": 3}}),
    _obj({"ids": {"type": "array", "items": AGE, "minItems": 1, "maxItems": 4}}),
    _obj({"user": _obj({"name": NAME, "age": AGE})}),
    _obj({"a": _obj({"b": _obj({"c": {"type": "integer", "minimum": 1, "maximum": 9}})})}),
    _obj({"people": {"type": "array", "items": _obj({"name": NAME}), "maxItems": 2}}),
    _obj({"kind": {"const": "point"}, "x": SCORE, "y": SCORE}),
    _obj({"name": NAME, "note": {"type": ["string", "null"], "maxLength": 6}}, ["name"]),
    _obj({"v": {"anyOf": [AGE, {"type": "boolean"}]}}),
    _obj({"level": {"enum": [1, 2, 3]}, "label": COLOR}),
    {"type": "array", "items": AGE, "minItems": 2, "maxItems": 3},
    {"enum": ["yes", "no", "maybe"]},
    _obj(
        {
            "matrix": {
                "type": "array",
                "items": {"type": "array", "items": AGE, "maxItems": 2},
                "maxItems": 2,
            }
        }
    ),
    _obj({"id": {"type": "string", "pattern": "^[a-f0-9]{4}$"}, "count": AGE}),
    _obj(
        {
            "meta": _obj(
                {
                    "colors": {"type": "array", "items": COLOR, "maxItems": 2},
                    "ok": {"type": "boolean"},
                }
            ),
            "name": NAME,
        }
    ),
]

PROMPT = "Answer in JSON. The function returns"
PLAIN_PROMPTS = ["The function returns", "Return the current", "A list of the"]


def _engine(lm: tuple[Any, Any]) -> Engine:
    model, tok = lm
    return Engine(model, tok, EngineConfig(kv_budget_tokens=16_384, max_running=64))


def _texts(outputs: list[StepOutput]) -> tuple[dict[str, str], dict[str, StepOutput]]:
    texts: dict[str, str] = {}
    finals: dict[str, StepOutput] = {}
    for o in outputs:
        texts[o.request_id] = texts.get(o.request_id, "") + o.text
        if o.finish is not None:
            finals[o.request_id] = o
    return texts, finals


def _plain(i: int) -> SamplingConfig:
    # Greedy and seeded sampling both: a constrained neighbour must change neither.
    return SamplingConfig() if i % 2 == 0 else SamplingConfig(temperature=0.9, seed=7 + i)


def test_twenty_schemas_validate_batched_with_unconstrained_rows_unchanged(
    lm: tuple[Any, Any],
) -> None:
    tok = lm[1]
    alone = _engine(lm)
    plain_ids = [tok(p)["input_ids"] for p in PLAIN_PROMPTS]
    for i, ids in enumerate(plain_ids):
        alone.add_request(EngineRequest(f"p{i}", ids, max_tokens=24, sampling=_plain(i)))
    alone_texts, _ = _texts(alone.run_until_idle())

    engine = _engine(lm)
    prompt = tok(PROMPT)["input_ids"]
    for i, schema in enumerate(SCHEMAS):
        sampling = SamplingConfig() if i % 3 else SamplingConfig(temperature=1.0, seed=i)
        structure = ("json_schema", json.dumps(schema))
        engine.add_request(
            EngineRequest(f"s{i}", prompt, max_tokens=160, sampling=sampling, structure=structure)
        )
    for i, ids in enumerate(plain_ids):
        engine.add_request(EngineRequest(f"p{i}", ids, max_tokens=24, sampling=_plain(i)))
    texts, finals = _texts(engine.run_until_idle())

    for i, schema in enumerate(SCHEMAS):
        out = finals[f"s{i}"]
        assert out.finish is Status.FINISHED_STOPPED, (i, out, texts[f"s{i}"])
        value = json.loads(texts[f"s{i}"])
        jsonschema_rs.validate(schema, value)
    for i in range(len(PLAIN_PROMPTS)):
        assert texts[f"p{i}"] == alone_texts[f"p{i}"]
    assert engine.grammars.misses == len(SCHEMAS)


def test_json_object_and_length_and_bad_schema(lm: tuple[Any, Any]) -> None:
    tok = lm[1]
    engine = _engine(lm)
    prompt = tok(PROMPT)["input_ids"]
    schema = json.dumps(SCHEMAS[5])
    engine.add_request(
        EngineRequest("short", prompt, max_tokens=3, structure=("json_schema", schema))
    )
    engine.add_request(
        EngineRequest(
            "obj",
            prompt,
            max_tokens=64,
            sampling=SamplingConfig(temperature=1.0, seed=3),
            structure=("json_object", ""),
        )
    )
    engine.add_request(EngineRequest("bad", prompt, structure=("json_schema", '{"type": "frob"}')))
    engine.add_request(
        EngineRequest("same", prompt, max_tokens=64, structure=("json_schema", schema))
    )
    texts, finals = _texts(engine.run_until_idle())
    assert finals["short"].finish is Status.FINISHED_LENGTH
    assert finals["short"].completion_tokens == 3
    assert texts["obj"].startswith("{")
    if finals["obj"].finish is Status.FINISHED_STOPPED:
        assert isinstance(json.loads(texts["obj"]), dict)
    assert finals["bad"].finish is Status.FINISHED_ERROR
    assert "frob" in (finals["bad"].error or "")
    jsonschema_rs.validate(SCHEMAS[5], json.loads(texts["same"]))
    assert engine.grammars.hits >= 1


def test_ignore_eos_ends_when_the_grammar_is_complete(lm: tuple[Any, Any]) -> None:
    tok = lm[1]
    engine = _engine(lm)
    schema = json.dumps(SCHEMAS[3])
    engine.add_request(
        EngineRequest(
            "r",
            tok(PROMPT)["input_ids"],
            max_tokens=64,
            ignore_eos=True,
            structure=("json_schema", schema),
        )
    )
    texts, finals = _texts(engine.run_until_idle())
    assert finals["r"].finish is Status.FINISHED_STOPPED
    jsonschema_rs.validate(SCHEMAS[3], json.loads(texts["r"]))
