"""The wire contract: messages, their encoding, settings, names and the committed schemas."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest
from pydantic import Field, ValidationError

from shared.codec import DecodeError, decode, encode
from shared.messages import (
    SEED_MAX,
    WIRE_MODELS,
    Batch,
    BatcherStatus,
    CancelRequest,
    ChatMessage,
    Completion,
    DeadLetter,
    EdgeHeartbeat,
    ErrorInfo,
    FinishReason,
    GenerateRequest,
    Priority,
    ReplyTarget,
    SamplingParams,
    TokenEvent,
    Usage,
    WorkerHeartbeat,
    error_event,
    new_request_id,
    seed_of,
)
from shared.model_config import SamplingDefaults
from shared.names import Names
from shared.prefix_hash import BLOCK_SIZE
from shared.schemas import SCHEMA_DIR, export_schemas, render, stale_schemas
from shared.settings import CommonSettings, EnvSettings, SettingsError


def full_request() -> GenerateRequest:
    return GenerateRequest(
        request_id="req-1.a:b_c-d",
        created_at=1_700_000_000.25,
        tenant="acme",
        priority=Priority.BULK,
        model="tiny",
        messages=[
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="user", content="héllo 中文 😀"),
        ],
        sampling=SamplingParams(
            max_tokens=32,
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            seed=SEED_MAX,
            stop=["\n\n", "END"],
            stop_token_ids=[2, 0],
            ignore_eos=True,
            min_p=0.05,
            include_stop_str_in_output=True,
            min_tokens=2,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.2,
            logit_bias={17: -100.0, 5: 2.5},  # int keys: JSON object keys are strings
            logprobs=3,
        ),
        stream=False,
        reply=ReplyTarget(redis=False, kafka_topic="acme.completions"),
        deadline=1_700_000_060.0,
    )


SAMPLES = [
    GenerateRequest(prompt="hello"),
    full_request(),
    TokenEvent(request_id="r1", seq=0, text="hé", token_ids=[5, 6]),
    TokenEvent(
        request_id="r1",
        seq=7,
        finish_reason=FinishReason.LENGTH,
        usage=Usage(prompt_tokens=3, completion_tokens=4, cached_tokens=2),
    ),
    error_event("r2", 3, "invalid_request", "nope"),
    Completion(
        request_id="r3",
        text="done",
        token_ids=[1, 2],
        finish_reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=1, completion_tokens=2),
        created_at=1.5,
        finished_at=2.5,
        worker_id="w1",
    ),
    Batch(batcher_id="b1", requests=[GenerateRequest(prompt="a"), full_request()]),
    WorkerHeartbeat(
        worker_id="w1",
        partitions=[0, 3],
        free_slots=5,
        prefix_hashes=[-1, 2**62],
        ttft_le=[0.1, 1.0],
        ttft_counts=[2, 5, 6],
    ),
    EdgeHeartbeat(edge_id="e1", ttl_s=3.0, address="http://e1:8000", started_at=1.0, requests=7),
    BatcherStatus(batcher_id="b1", queued_requests=3, queued_tokens=900, paused=True),
    CancelRequest(request_id="r4"),
    DeadLetter(
        reason="undecodable",
        detail="bad",
        topic="tw.requests",
        partition=2,
        offset=99,
        key="k",
        original_b64=base64.b64encode(b"\xff").decode(),
    ),
]


# --- encode / decode ---------------------------------------------------------------------------
@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: GenerateRequest) -> None:
    data = encode(msg)
    assert isinstance(data, bytes)
    assert decode(type(msg), data) == msg
    assert decode(type(msg), data.decode()) == msg  # str input works too


def test_every_wire_model_is_sampled() -> None:
    assert {type(m) for m in SAMPLES} == set(WIRE_MODELS)


def test_encoding_is_compact_and_leaves_out_none() -> None:
    data = encode(TokenEvent(request_id="r", seq=1, text="x"))
    assert b" " not in data
    obj = orjson.loads(data)
    assert "finish_reason" not in obj and "usage" not in obj and "error" not in obj
    req = orjson.loads(encode(GenerateRequest(prompt="p")))
    assert "messages" not in req and "seed" not in req["sampling"]
    assert req["priority"] == "interactive"


@pytest.mark.parametrize("data", [b"", b"{", b"{'a': 1}", b"\xff\xfe", b"nul", "{"])
def test_non_json_is_undecodable(data: bytes | str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(GenerateRequest, data)
    err = info.value
    assert err.reason == "undecodable"
    assert err.detail
    assert str(err).startswith("undecodable: ")
    assert err.retriable is False
    assert isinstance(err, ValueError)


def test_json_that_does_not_validate_is_invalid_with_a_readable_path() -> None:
    data = orjson.dumps({"prompt": "x", "sampling": {"max_tokens": 0, "top_p": 0}})
    with pytest.raises(DecodeError) as info:
        decode(GenerateRequest, data)
    err = info.value
    assert err.reason == "invalid"
    assert "sampling.max_tokens" in err.detail
    assert "sampling.top_p" in err.detail
    assert "greater than" in err.detail
    assert err.retriable is False


def test_a_json_value_that_is_not_an_object_is_invalid_at_the_root() -> None:
    with pytest.raises(DecodeError) as info:
        decode(GenerateRequest, b"[1, 2]")
    assert info.value.reason == "invalid"
    assert info.value.detail.startswith("<root>:")


def test_many_errors_are_summarized() -> None:
    data = orjson.dumps(
        {
            "v": 2,
            "tenant": "",
            "priority": "urgent",
            "prompt": 1,
            "stream": [],
            "deadline": "soon",
            "model": 5,
        }
    )
    with pytest.raises(DecodeError) as info:
        decode(GenerateRequest, data)
    detail = info.value.detail
    assert detail.count(";") == 4  # five shown
    assert detail.endswith("more)")


ONE_INPUT = "exactly one of 'prompt', 'messages' and 'prompt_token_ids'"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({}, ONE_INPUT),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, ONE_INPUT),
        ({"prompt": None, "messages": None}, ONE_INPUT),
        ({"prompt": "a", "prompt_token_ids": [1, 2]}, ONE_INPUT),
        ({"prompt_token_ids": [1], "retrieval": {"index": "kb"}}, "not token ids"),
    ],
)
def test_exactly_one_of_prompt_messages_and_token_ids(body: dict[str, object], why: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(GenerateRequest, orjson.dumps(body))
    assert info.value.reason == "invalid"
    assert why in info.value.detail
    with pytest.raises(ValidationError):
        GenerateRequest.model_validate(body)


def test_prompt_or_messages_alone_is_fine() -> None:
    assert decode(GenerateRequest, b'{"prompt": ""}').prompt == ""
    req = decode(GenerateRequest, b'{"messages": [{"role": "user", "content": "hi"}]}')
    assert req.messages == [ChatMessage(role="user", content="hi")]
    with pytest.raises(DecodeError):
        decode(GenerateRequest, b'{"messages": []}')


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"prompt": "x", "colour": "red"}, "colour"),
        ({"prompt": "x", "sampling": {"temprature": 0.5}}, "sampling.temprature"),
        ({"prompt": "x", "reply": {"redis": True, "topic": "t"}}, "reply.topic"),
        ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "messages.0.name"),
    ],
)
def test_unknown_fields_are_rejected(body: dict[str, object], where: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(GenerateRequest, orjson.dumps(body))
    assert info.value.reason == "invalid"
    assert where in info.value.detail
    assert "Extra inputs are not permitted" in info.value.detail


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "request_id": "has space"},
        {"prompt": "x", "request_id": ""},
        {"prompt": "x", "request_id": "r" * 129},
        {"prompt": "x", "tenant": "a/b"},
        {"prompt": "x", "v": 2},
        {"prompt": "x", "sampling": {"seed": -1}},
        {"prompt": "x", "sampling": {"seed": SEED_MAX + 1}},
        {"prompt": "x", "sampling": {"temperature": -0.1}},
        {"prompt": "x", "sampling": {"stop": [""]}},
        {"prompt": "x", "sampling": {"stop": ["s"] * 9}},
        {"prompt": "x", "sampling": {"stop_token_ids": [-1]}},
        {"prompt": "x", "reply": {"kafka_topic": "bad topic"}},
        {"messages": [{"role": "tool", "content": "x"}]},
    ],
)
def test_out_of_range_values_are_invalid(body: dict[str, object]) -> None:
    with pytest.raises(DecodeError) as info:
        decode(GenerateRequest, orjson.dumps(body))
    assert info.value.reason == "invalid"


def test_every_integer_a_producer_writes_is_bounded() -> None:
    """Each integer of a request (what producers outside the project write) has a bound
    within 64 bits: a larger one (sent as a numeric string, which validation reads as an
    int) validated and then failed to encode where the batcher sent it on. Dict keys (a
    logit bias's token ids) are bounded by their own type, tested below."""
    unbounded = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            is_int = node.get("type") == "integer" and "const" not in node and "enum" not in node
            if is_int and "maximum" not in node and "exclusiveMaximum" not in node:
                unbounded.append(path)
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(GenerateRequest.model_json_schema(), "")
    assert not unbounded


@pytest.mark.parametrize(
    "field",
    [
        b'"prompt_token_ids": [99999999999999999999]',
        b'"prompt_token_ids": [2147483648]',
        b'"prompt": "x", "sampling": {"stop_token_ids": [99999999999999999999]}',
        b'"prompt": "x", "sampling": {"logit_bias": {"99999999999999999999": 1}}',
        b'"prompt": "x", "sampling": {"top_k": "99999999999999999999"}',
    ],
)
def test_an_integer_past_its_bound_is_invalid(field: bytes) -> None:
    """A producer's token id no vocabulary has, or a top_k past its bound, is refused where
    it is decoded (past 64 bits it validated, and failed to encode where it was sent on)."""
    with pytest.raises(DecodeError) as info:
        decode(GenerateRequest, b'{"request_id": "r1", "tenant": "t", ' + field + b"}")
    assert info.value.reason == "invalid"


def test_defaults() -> None:
    req = GenerateRequest(prompt="p")
    assert req.request_id.startswith("req-") and len(req.request_id) == 4 + 32
    assert req.tenant == "default" and req.priority is Priority.INTERACTIVE
    assert req.sampling == SamplingParams()
    assert req.sampling.max_tokens == 16 and req.sampling.seed is None
    # Sampling fields left out stay out on the wire: the worker gives the model's defaults.
    assert req.sampling.temperature is req.sampling.top_p is req.sampling.top_k is None
    assert b"temperature" not in encode(req)
    assert req.reply.redis and req.reply.kafka_topic is None
    assert new_request_id() != new_request_id()


def test_interactive_is_served_before_bulk() -> None:
    assert [p.rank for p in Priority] == [0, 1]
    assert Priority.INTERACTIVE.rank < Priority.BULK.rank
    assert Priority("bulk").rank == Priority.BULK.rank


# --- heartbeats ---------------------------------------------------------------------------------
def test_a_heartbeat_carries_how_its_prefix_hashes_were_cut() -> None:
    hb = WorkerHeartbeat(worker_id="w1", prefix_hashes=[5], block_size=32, affinity_depth=4)
    back = decode(WorkerHeartbeat, encode(hb))
    assert (back.block_size, back.affinity_depth) == (32, 4)
    assert back == hb


def test_a_heartbeat_from_before_the_fields_still_decodes() -> None:
    old = orjson.dumps({"worker_id": "w1", "partitions": [1], "free_slots": 3})
    hb = decode(WorkerHeartbeat, old)
    assert (hb.block_size, hb.affinity_depth) == (0, 0)  # not advertised
    with pytest.raises(DecodeError):
        decode(WorkerHeartbeat, orjson.dumps({"worker_id": "w1", "block_size": -1}))


# --- seeds ---------------------------------------------------------------------------------------
def test_with_seed_keeps_a_given_seed() -> None:
    for seed in (0, 7, SEED_MAX):
        req = GenerateRequest(prompt="p", sampling=SamplingParams(seed=seed))
        assert req.with_seed().sampling.seed == seed


def test_with_seed_sets_one_without_touching_the_original() -> None:
    req = GenerateRequest(prompt="p", sampling=SamplingParams(temperature=0.5, top_k=3))
    seeded = req.with_seed()
    assert req.sampling.seed is None
    assert seeded.sampling.seed is not None and 0 <= seeded.sampling.seed <= SEED_MAX
    # Everything else is unchanged, and the seed survives the wire.
    assert seeded.model_copy(update={"sampling": req.sampling}) == req
    assert decode(GenerateRequest, encode(seeded)).sampling.seed == seeded.sampling.seed
    assert seeded.with_seed().sampling.seed == seeded.sampling.seed


def test_an_unseeded_request_gets_the_same_seed_at_every_consumption() -> None:
    """A redelivered request (a batcher crash, a takeover) samples the same tokens."""
    raw = encode(GenerateRequest(prompt="p", sampling=SamplingParams(temperature=0.8)))
    first = decode(GenerateRequest, raw).with_seed().sampling.seed
    again = decode(GenerateRequest, raw).with_seed().sampling.seed
    assert first == again == seed_of(decode(GenerateRequest, raw).request_id)
    seeds = {seed_of(new_request_id()) for _ in range(100)}
    assert len(seeds) == 100 and all(0 <= s <= SEED_MAX for s in seeds)


# --- small message helpers ---------------------------------------------------------------------
def test_error_event_is_final_and_bounded() -> None:
    ev = error_event("r", 4, "boom", "x" * 10_000)
    assert ev.final and ev.finish_reason is FinishReason.ERROR
    assert ev.error == ErrorInfo(code="boom", message="x" * 4096)
    assert decode(TokenEvent, encode(ev)) == ev


def test_usage_and_final() -> None:
    assert Usage(prompt_tokens=3, completion_tokens=4).total_tokens == 7
    assert not TokenEvent(request_id="r", seq=0).final
    with pytest.raises(ValidationError):
        TokenEvent(request_id="r", seq=-1)


def test_a_batch_is_never_empty() -> None:
    with pytest.raises(DecodeError):
        decode(Batch, b'{"requests": []}')


# --- settings ----------------------------------------------------------------------------------
class SampleSettings(EnvSettings):
    model_dir: str
    port: int = Field(8000, ge=1)
    verbose: bool = False
    ratio: float = 0.5


def test_settings_defaults_from_an_empty_environ() -> None:
    s = CommonSettings.from_env({})
    assert s == CommonSettings()
    assert s.topic_prefix == "tw"
    assert s.kafka_bootstrap and s.redis_url.startswith("redis://")
    assert s.names == Names("tw")


def test_settings_read_tw_variables_and_parse_them() -> None:
    env = {
        "TW_MODEL_DIR": "/models/tiny",
        "TW_PORT": "9001",
        "TW_VERBOSE": "true",
        "TW_RATIO": "0.25",
        "PORT": "1",  # not ours
        "TW_SOMETHING_ELSE": "ignored",  # not a field of this class
    }
    s = SampleSettings.from_env(env)
    assert (s.model_dir, s.port, s.verbose, s.ratio) == ("/models/tiny", 9001, True, 0.25)
    assert SampleSettings.env_key("model_dir") == "TW_MODEL_DIR"


def test_settings_overrides_win_over_the_environ() -> None:
    s = SampleSettings.from_env({"TW_MODEL_DIR": "/a", "TW_PORT": "1"}, port=2)
    assert s.port == 2 and s.model_dir == "/a"


def test_settings_read_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TW_TOPIC_PREFIX", "envtest")
    assert CommonSettings.from_env().topic_prefix == "envtest"


def test_a_bad_value_fails_naming_the_variable() -> None:
    with pytest.raises(SettingsError) as info:
        SampleSettings.from_env({"TW_MODEL_DIR": "/m", "TW_PORT": "eighty"})
    msg = str(info.value)
    assert "TW_PORT" in msg and "'eighty'" in msg
    assert "TW_MODEL_DIR" not in msg
    with pytest.raises(SettingsError, match="TW_PORT"):
        SampleSettings.from_env({"TW_MODEL_DIR": "/m", "TW_PORT": "0"})  # below ge=1


def test_a_missing_required_value_fails_naming_the_variable() -> None:
    with pytest.raises(SettingsError) as info:
        SampleSettings.from_env({"TW_PORT": "eighty"})
    msg = str(info.value)
    assert "TW_MODEL_DIR='<unset>'" in msg
    assert "TW_PORT='eighty'" in msg  # every problem is listed at once


def test_settings_are_frozen() -> None:
    s = CommonSettings.from_env({})
    with pytest.raises(ValidationError):
        s.topic_prefix = "other"  # type: ignore[misc]


def test_service_settings_name_their_variables() -> None:
    from services.worker.config import WorkerSettings

    with pytest.raises(SettingsError, match="TW_MODEL_DIR"):
        WorkerSettings.from_env({})
    ok = WorkerSettings.from_env({"TW_MODEL_DIR": "/m", "TW_PREFIX_CACHE": "false"})
    assert ok.prefix_cache is False and ok.model_dir == "/m"
    with pytest.raises(SettingsError, match="TW_DEVICE"):
        WorkerSettings.from_env({"TW_MODEL_DIR": "/m", "TW_DEVICE": "tpu"})


def test_the_batcher_and_the_workers_read_one_block_size_and_heartbeat_ttl() -> None:
    from services.batcher.config import BatcherSettings
    from services.worker.config import WorkerSettings

    env = {"TW_MODEL_DIR": "/m", "TW_BLOCK_SIZE": "32", "TW_HEARTBEAT_TTL_S": "5"}
    worker, batcher = WorkerSettings.from_env(env), BatcherSettings.from_env(env)
    assert (worker.block_size, worker.heartbeat_ttl_s) == (32, 5.0)
    assert (batcher.block_size, batcher.heartbeat_ttl_s) == (32, 5.0)
    defaults = WorkerSettings(model_dir="/m"), BatcherSettings()
    assert {(s.block_size, s.heartbeat_ttl_s) for s in defaults} == {(BLOCK_SIZE, 3.0)}


# --- names ---------------------------------------------------------------------------------------
def test_every_name_carries_the_prefix() -> None:
    n = Names("t1")
    assert n.topics == ("t1.requests", "t1.batches", "t1.completions", "t1.requests.dlq")
    assert (n.batcher_group, n.worker_group) == ("t1.batcher", "t1.worker")
    assert n.token_channel("r") == "t1:tok:{r}"
    assert n.token_log("r") == "t1:log:{r}"
    assert n.done_marker("r") == "t1:done:{r}"
    assert n.cancel_channel == "t1:cancel"
    assert n.heartbeat("w").startswith(n.heartbeat_prefix)
    assert Names() == Names("tw")


def test_names_of_different_prefixes_never_collide() -> None:
    a, b = Names("a"), Names("b")

    def every(n: Names) -> set[str]:
        return {
            *n.topics,
            n.batcher_group,
            n.worker_group,
            n.token_channel("r"),
            n.token_log("r"),
            n.done_marker("r"),
            n.cancel_channel,
            n.heartbeat("w"),
        }

    assert len(every(a)) == 11
    assert every(a).isdisjoint(every(b))
    assert CommonSettings.from_env({"TW_TOPIC_PREFIX": "a"}).names == a


# --- schemas -----------------------------------------------------------------------------------
def test_committed_schemas_are_up_to_date() -> None:
    assert stale_schemas() == [], "run `tokenwire schema` and commit shared/schemas/"


def test_one_schema_per_wire_model() -> None:
    rendered = render()
    assert set(rendered) == {f"{m.__name__}.json" for m in WIRE_MODELS}
    assert {p.name for p in SCHEMA_DIR.glob("*.json")} == set(rendered)
    req = orjson.loads(rendered["GenerateRequest.json"])
    assert req["$id"].endswith("/GenerateRequest.json")
    assert req["additionalProperties"] is False  # producers learn that extras are refused
    assert rendered == render()  # byte-stable


def test_stale_schemas_notices_missing_and_edited_files(tmp_path: Path) -> None:
    assert sorted(stale_schemas(tmp_path)) == sorted(render())
    written = export_schemas(tmp_path)
    assert {p.name for p in written} == set(render())
    assert stale_schemas(tmp_path) == []
    (tmp_path / "Batch.json").write_bytes(b"{}\n")
    (tmp_path / "TokenEvent.json").unlink()
    assert sorted(stale_schemas(tmp_path)) == ["Batch.json", "TokenEvent.json"]


def test_sampling_left_out_takes_the_model_defaults(tmp_path: Path) -> None:
    assert SamplingDefaults.of_folder(tmp_path).resolve(None, None, None) == (1.0, 1.0, 0)
    (tmp_path / "generation_config.json").write_text(
        '{"do_sample": true, "temperature": 0.6, "top_p": 0.9, "eos_token_id": [1, 2]}'
    )
    defaults = SamplingDefaults.of_folder(tmp_path)
    assert defaults.resolve(None, None, None) == (0.6, 0.9, 0)
    assert defaults.resolve(0.0, None, 5) == (0.0, 0.9, 5)  # what a request gives wins
    assert defaults.unapplied == ()
    (tmp_path / "generation_config.json").write_text(
        '{"repetition_penalty": 1.1, "min_p": 0.05, "typical_p": 0.9}'
    )
    stated = SamplingDefaults.of_folder(tmp_path)
    assert stated.unapplied == ("typical_p",)
    assert stated.repetition(None) == 1.1 and stated.repetition(1.0) == 1.0
    assert stated.min_prob(None) == 0.05 and stated.min_prob(0.0) == 0.0
    assert defaults.min_prob(None) == 0.0  # not stated: off


def test_min_tokens_cannot_exceed_max_tokens() -> None:
    assert SamplingParams(max_tokens=5, min_tokens=5).min_tokens == 5
    with pytest.raises(ValidationError):
        SamplingParams(max_tokens=4, min_tokens=5)
