"""Edge pieces without I/O: the RESP parser of the shared subscriber, SSE framing, OpenAI
shapes, request bodies, API-key parsing, and the replay dedup of ``EventStream``."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from pydantic import ValidationError

from services.edge.auth import bearer_token, hash_key, new_key, parse_key_list
from services.edge.config import EdgeSettings
from services.edge.hub import RESYNC
from services.edge.openai_api import ChatBody, CompletionBody
from services.edge.shapes import Shape
from services.edge.sse import DONE, frame
from shared.resp import RespParser, command
from shared.settings import SettingsError


def _message(channel: bytes, data: bytes) -> bytes:
    return command(b"message", channel, data)


def test_resp_parser_handles_split_and_batched_replies() -> None:
    wire = (
        b"*3\r\n$9\r\nsubscribe\r\n$4\r\ntw:a\r\n:1\r\n"
        + _message(b"tw:a", b'{"seq":0}')
        + _message(b"tw:a", b"x\r\ny")  # payloads may hold CRLF
        + b"-ERR wrong\r\n"
        + b"*2\r\n$-1\r\n+OK\r\n"
    )
    for step in (1, 3, 7, len(wire)):
        parser = RespParser()
        out = []
        for i in range(0, len(wire), step):
            out += parser.feed(wire[i : i + step])
        assert out[0] == [b"subscribe", b"tw:a", 1]
        assert out[1] == [b"message", b"tw:a", b'{"seq":0}']
        assert out[2] == [b"message", b"tw:a", b"x\r\ny"]
        assert str(out[3]) == "ERR wrong"
        assert out[4] == [None, b"OK"]
        assert len(out) == 5


def test_command_encodes_resp_arrays() -> None:
    assert command(b"SUBSCRIBE", b"tw:tok:r1") == b"*2\r\n$9\r\nSUBSCRIBE\r\n$9\r\ntw:tok:r1\r\n"


def test_sse_frames_carry_the_seq_as_id() -> None:
    assert frame({"a": 1}, 7) == b'id: 7\ndata: {"a":1}\n\n'
    assert frame({"a": 1}) == b'data: {"a":1}\n\n'
    assert DONE == b"data: [DONE]\n\n"


@pytest.mark.parametrize("ids", [False, True])
@pytest.mark.parametrize("rid", ["cmpl-abc", "chatcmpl-abc"])
def test_fast_chunks_equal_the_dict_shape(rid: str, ids: bool) -> None:
    shape = Shape(rid, "tokenwire-tiny", 123, token_ids=ids)
    for ev in (
        {"seq": 0, "text": 'a "quoted"\n é', "token_ids": [7, 8]},
        {"seq": 3, "text": ""},
    ):
        fast = orjson.loads(shape.chunk_json(ev))
        expected = shape.final_chunk({**ev, "finish_reason": "x"})
        expected["choices"][0]["finish_reason"] = None
        assert fast == expected
        assert fast["choices"][0].get("token_ids") == (ev.get("token_ids", []) if ids else None)
    sse = shape.sse({"seq": 4, "text": "hi"})
    assert sse.startswith(b"id: 4\ndata: {") and sse.endswith(b"\n\n")


def test_final_chunk_usage_and_whole_response() -> None:
    shape = Shape("chatcmpl-1", "m", 1)
    last = {
        "seq": 2,
        "text": "!",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 2},
    }
    assert orjson.loads(shape.chunk_json(last))["choices"][0]["finish_reason"] == "length"
    usage = shape.usage_chunk(last)
    assert usage is not None
    body = orjson.loads(usage[len(b"data: ") :])
    assert body["choices"] == [] and body["usage"]["total_tokens"] == 8
    whole = shape.whole("abc!", last)
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "abc!"}
    assert whole["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert "token_ids" not in whole["choices"][0]
    with_ids = Shape("cmpl-1", "m", 1, token_ids=True).whole("abc!", last, [4, 5, 6])
    assert with_ids["choices"][0]["token_ids"] == [4, 5, 6]


def test_error_events_render_as_openai_errors() -> None:
    shape = Shape("cmpl-1", "m", 1)
    ev = {"seq": 0, "finish_reason": "error", "error": {"code": "invalid_request", "message": "no"}}
    data = orjson.loads(shape.sse(ev).split(b"data: ", 1)[1])
    assert data == {
        "error": {"message": "no", "type": "invalid_request_error", "code": "invalid_request"}
    }


def test_bodies_map_onto_generate_requests() -> None:
    body = CompletionBody.model_validate(
        {"model": "m", "prompt": ["hi"], "stop": "x", "seed": 3, "ignore_eos": True}
    )
    req = body.to_request("cmpl-1", "acme", 9)
    assert (req.prompt, req.tenant, req.request_id) == ("hi", "acme", "cmpl-1")
    assert req.sampling.stop == ["x"] and req.sampling.max_tokens == 9
    assert req.sampling.ignore_eos and req.sampling.seed == 3
    chat = ChatBody.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 5,
        }
    )
    assert chat.requested_max_tokens() == 5
    msgs = chat.to_request("chatcmpl-1", "t", 5).messages
    assert msgs is not None
    assert [(m.role, m.content) for m in msgs] == [("system", "be brief"), ("user", "ab")]


@pytest.mark.parametrize(
    "patch",
    [
        {"max_tokens": -1},
        {"max_tokens": 0},
        {"n": 17},
        {"n": 5, "prompt": ["a"] * 13},  # 65 choices
        {"n": 2, "resumable": True},
        {"echo": True, "logprobs": 1},
        {"echo": True, "resumable": True},
        {"temperature": 3},
        {"stop": [""]},
        {"stop": ["a"] * 9},
        {"prompt": ["a"] * 17},
        {"prompt": []},
        {"prompt": [[]]},
        {"prompt": [-1]},
        {"prompt": [1, "a"]},
        {"prompt": 5},
        {"seed": -1},
    ],
)
def test_bad_parameters_fail_validation(patch: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CompletionBody.model_validate({"model": "m", "prompt": "x", **patch})


# OpenAI request fields this server does not implement: each must be refused, none ignored.
UNSUPPORTED = {
    "best_of": 2,
    "suffix": "x",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "service_tier": "auto",
    "prediction": {"type": "content", "content": "x"},
    "modalities": ["text"],
    "reasoning_effort": "low",
}


# Served on chat only: refused on completions.
CHAT_ONLY = {
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
}


@pytest.mark.parametrize(
    ("field", "body"),
    [(f, b) for f in UNSUPPORTED for b in (CompletionBody, ChatBody)]
    + [(f, CompletionBody) for f in CHAT_ONLY],
)
def test_a_field_the_edge_does_not_implement_is_refused(
    field: str, body: type[CompletionBody | ChatBody]
) -> None:
    base: dict[str, object] = {
        "model": "m",
        "prompt": "x",
        "messages": [{"role": "user", "content": "x"}],
    }
    base.pop("messages" if body is CompletionBody else "prompt")
    with pytest.raises(ValidationError) as err:
        body.model_validate({**base, field: {**UNSUPPORTED, **CHAT_ONLY}[field]})
    assert err.value.errors()[0]["type"] == "extra_forbidden"
    assert err.value.errors()[0]["loc"] == (field,)


def test_min_p_and_include_stop_str_in_output_map_onto_the_wire() -> None:
    for body in (
        CompletionBody.model_validate(
            {"model": "m", "prompt": "x", "min_p": 0.2, "include_stop_str_in_output": True}
        ),
        ChatBody.model_validate(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "min_p": 0.2,
                "include_stop_str_in_output": True,
            }
        ),
    ):
        sp = body.to_request("cmpl-1", "t", 4).sampling
        assert sp.min_p == 0.2 and sp.include_stop_str_in_output
    plain = CompletionBody.model_validate({"model": "m", "prompt": "x", "min_p": None})
    sp = plain.to_request("cmpl-2", "t", 4).sampling
    assert sp.min_p is None  # the model's default
    assert not sp.include_stop_str_in_output
    for bad in ({"min_p": -0.1}, {"min_p": 1.5}, {"include_stop_str_in_output": "maybe"}):
        with pytest.raises(ValidationError) as err:
            CompletionBody.model_validate({"model": "m", "prompt": "x", **bad})
        assert err.value.errors()[0]["loc"] == tuple(bad)


def test_metadata_is_accepted_and_null_means_the_default() -> None:
    body = CompletionBody.model_validate(
        {
            "model": "m",
            "prompt": "x",
            "user": "u1",
            "metadata": {"team": "a"},
            "store": False,
            "temperature": None,
            "stream": None,
            "stop": None,
            "stream_options": None,
        }
    )
    assert body.temperature is None and body.stream is False and body.stop is None
    assert body.to_request("cmpl-1", "t", 4).sampling.temperature is None  # the model's default
    ids = CompletionBody.model_validate({"model": "m", "prompt": "x", "stop_token_ids": [7, 9]})
    assert ids.to_request("cmpl-2", "t", 4).sampling.stop_token_ids == [7, 9]
    with pytest.raises(ValidationError):  # a message's unknown fields too
        ChatBody.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "x", "name": "bob"}]}
        )


def test_api_keys_are_parsed_as_digests() -> None:
    key = new_key()
    assert key.startswith("twk-") and len(key) > 30
    digest = hash_key(key)
    assert parse_key_list(f" {digest}=acme , {hash_key('b')}=beta ") == {
        digest: "acme",
        hash_key("b"): "beta",
    }
    for bad in ("plainkey=acme", f"{digest}", f"{digest}=bad tenant"):
        with pytest.raises(ValueError, match="TW_API_KEYS"):
            parse_key_list(bad)
    with pytest.raises(SettingsError, match="TW_API_KEYS"):
        EdgeSettings.from_env({"TW_API_KEYS": "nope"})


def test_bearer_token() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


class _FakeHub:
    """Stands in for the shared subscriber: records the queue so the test can publish."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] | None = None

    async def subscribe(self, channel: bytes, queue: asyncio.Queue[bytes]) -> None:
        self.queue = queue

    def unsubscribe(self, channel: bytes, queue: asyncio.Queue[bytes]) -> None:
        self.queue = None


class _FakeLog:
    """A replay log read through ``xrange`` like the real token stream."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []

    async def xrange(self, key: str, min: str, max: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        start = int(min.split("-")[1]) - 1
        return [(b"", {b"d": e}) for e in self.entries if orjson.loads(e)["seq"] >= start]


def _ev(seq: int, final: bool = False) -> bytes:
    ev: dict[str, object] = {"request_id": "r", "seq": seq, "text": str(seq)}
    if final:
        ev["finish_reason"] = "stop"
    return orjson.dumps(ev)


async def test_event_stream_merges_log_and_live_without_gaps_or_duplicates() -> None:
    from services.edge.relay import EventStream
    from shared.names import Names

    hub, log = _FakeHub(), _FakeLog()
    log.entries = [_ev(0), _ev(1), _ev(2)]
    stream = EventStream(hub, log, Names("t"), "r", after_seq=0)  # type: ignore[arg-type]
    await stream.open()
    assert hub.queue is not None
    # Live copies of logged events, a gap (3 missed live, only in the log), then live.
    log.entries += [_ev(3), _ev(4)]
    for seq in (1, 2, 4):
        hub.queue.put_nowait(_ev(seq))
    hub.queue.put_nowait(RESYNC)
    hub.queue.put_nowait(_ev(5, final=True))
    hub.queue.put_nowait(_ev(6))  # nothing after the final event
    got = []
    while not stream.finished:
        got += [e["seq"] for e in await stream.next(1.0)]
    assert got == [1, 2, 3, 4, 5]
    assert await stream.next(0.01) == []
    stream.close()
    assert hub.queue is None


async def test_event_stream_resumed_after_the_final_event_is_finished() -> None:
    from services.edge.relay import EventStream
    from shared.names import Names

    hub, log = _FakeHub(), _FakeLog()
    log.entries = [_ev(0), _ev(1, final=True)]
    stream = EventStream(hub, log, Names("t"), "r", after_seq=1)  # type: ignore[arg-type]
    await stream.open()
    assert stream.finished and stream.final_event is not None
    assert await stream.next(0.01) == []


async def test_event_stream_completed_from_a_hits_events_needs_no_redis() -> None:
    from services.edge.relay import EventStream
    from shared.names import Names

    hub, log = _FakeHub(), _FakeLog()  # the log stays empty: nothing may read it
    stream = EventStream(hub, log, Names("t"), "r", after_seq=-1)  # type: ignore[arg-type]
    events = [orjson.loads(_ev(0)), orjson.loads(_ev(1)), orjson.loads(_ev(2, final=True))]
    assert stream.complete(events)
    assert [e["seq"] for e in await stream.next(1.0)] == [0, 1, 2]
    assert stream.finished and stream.final_event == events[-1]
    assert await stream.next(0.01) == []
    assert hub.queue is None  # never subscribed
    short = EventStream(hub, log, Names("t"), "r", after_seq=-1)  # type: ignore[arg-type]
    assert not short.complete(events[:2])  # without its final event: to be opened
    assert not short.finished


def test_request_ids_carry_shape_and_creation_time() -> None:
    from services.edge.shapes import created_of, is_chat_id, new_request_id

    rid = new_request_id(True, 1_796_000_000.7)
    assert rid.startswith("chatcmpl-") and is_chat_id(rid) and len(rid) == 9 + 32
    assert created_of(rid) == 1_796_000_000
    assert created_of(new_request_id(False, 5)) == 5
    assert abs(created_of("cmpl-zz") - time.time()) < 5  # foreign ids: now


def test_penalties_and_biases_map_onto_the_wire() -> None:
    body = CompletionBody.model_validate(
        {
            "model": "m",
            "prompt": "x",
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.2,
            "logit_bias": {"17": -100, "5": 2.5},
        }
    )
    sp = body.to_request("cmpl-1", "t", 4).sampling
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (0.5, -0.5, 1.2)
    assert sp.logit_bias == {17: -100.0, 5: 2.5}
    for bad in (
        {"logit_bias": {"x": 1}},
        {"logit_bias": {"1": 101}},
        {"logit_bias": {"99999999999999999999": 1}},  # past any vocabulary (and 64 bits)
        {"logit_bias": {"\u00b2": 1}},  # a digit to str.isdigit, not to int()
        {"presence_penalty": 2.5},
    ):
        with pytest.raises(ValidationError):
            CompletionBody.model_validate({"model": "m", "prompt": "x", **bad})


def test_choices_fan_out_one_request_each() -> None:
    """Prompts times n choices, index ``prompt * n + j``; choice j of a prompt samples with
    the client's seed plus j; one choice keeps the response's id."""
    body = CompletionBody.model_validate(
        {"model": "m", "prompt": ["a", "b"], "n": 3, "seed": 10, "temperature": 1}
    )
    reqs = body.to_requests("cmpl-1", "t", [4, 5])
    assert [r.request_id for r in reqs] == [f"cmpl-1-{i}" for i in range(6)]
    assert [r.prompt for r in reqs] == ["a"] * 3 + ["b"] * 3
    assert [r.sampling.seed for r in reqs] == [10, 11, 12] * 2
    assert [r.sampling.max_tokens for r in reqs] == [4] * 3 + [5] * 3
    unseeded = CompletionBody.model_validate({"model": "m", "prompt": [1, 2, 3], "n": 2})
    a, b = unseeded.to_requests("cmpl-2", "t", [4])
    assert a.prompt_token_ids == b.prompt_token_ids == [1, 2, 3]
    assert a.sampling.seed != b.sampling.seed  # each derived from its own id
    lists = CompletionBody.model_validate({"model": "m", "prompt": [[1], [2, 3]]})
    assert [r.prompt_token_ids for r in lists.to_requests("cmpl-3", "t", [1, 1])] == [[1], [2, 3]]
    [one] = CompletionBody.model_validate({"model": "m", "prompt": "x"}).to_requests(
        "cmpl-4", "t", [2]
    )
    assert one.request_id == "cmpl-4"
    with pytest.raises(ValueError, match="one choice"):  # bulk lines: one request per line
        body.to_request("cmpl-5", "t", 4)
