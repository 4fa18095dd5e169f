"""The Batch API's pure parts: checking an input file, result lines, request ids that name
their batch line, and a batch record's round trip through a Redis hash."""

from __future__ import annotations

import orjson

from services.edge.batch_lines import Checked, check_file, result_line, window
from services.edge.batch_store import BatchRecord, line_request_id, parse_request_id
from shared.kafka_io import MAX_VALUE_BYTES
from shared.messages import Completion, ErrorInfo, FinishReason, Priority, Usage

MODEL = "tokenwire-tiny"


def _check(content: bytes) -> Checked:
    """``check_file`` for a /v1/completions batch of tenant ``t``."""
    return check_file(
        content,
        batch_id="batch_x",
        endpoint="/v1/completions",
        model=MODEL,
        tenant="t",
        reply_topic="c",
    )


def test_valid_lines_become_bulk_requests_named_by_batch_and_index() -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    content = b"\n".join(
        orjson.dumps({"custom_id": f"c{i}", "url": "/v1/completions", "body": body})
        for i in range(3)
    )
    checked = check_file(
        content + b"\n\n",
        batch_id="batch_x",
        endpoint="/v1/completions",
        model=MODEL,
        tenant="acme",
        reply_topic="tw.completions",
    )
    assert checked.errors == []
    assert [j.custom_id for j in checked.jobs] == ["c0", "c1", "c2"]
    for i, job in enumerate(checked.jobs):
        req = job.request
        assert req.request_id == line_request_id("batch_x", i) == f"batch_x.{i}"
        assert parse_request_id(req.request_id) == ("batch_x", i)
        assert req.priority is Priority.BULK and req.tenant == "acme"
        assert req.reply.kafka_topic == "tw.completions" and not req.reply.redis
        assert req.sampling.max_tokens == 3


def test_a_window_parses_only_its_lines() -> None:
    body = {"model": MODEL, "prompt": "hi"}
    rows = [
        orjson.dumps({"custom_id": f"c{i}", "url": "/v1/completions", "body": body})
        for i in range(6)
    ]
    rows[0] = b"not json: never parsed, being before the window"
    jobs = window(
        b"\n\n".join(rows), start=2, count=3, batch_id="batch_x", tenant="t", reply_topic="c"
    )
    assert [j.custom_id for j in jobs] == ["c2", "c3", "c4"]
    assert [j.request.request_id for j in jobs] == ["batch_x.2", "batch_x.3", "batch_x.4"]


def test_each_bad_line_is_an_error_with_its_line_number() -> None:
    good = {"model": MODEL, "prompt": "hi"}
    content = b"\n".join(
        [
            orjson.dumps({"custom_id": "a", "url": "/v1/completions", "body": good}),
            orjson.dumps({"custom_id": "a", "url": "/v1/completions", "body": good}),
            orjson.dumps(
                {"custom_id": "b", "url": "/v1/completions", "body": {**good, "model": "x"}}
            ),
            orjson.dumps(
                {"custom_id": "c", "url": "/v1/completions", "body": {**good, "suffix": "!"}}
            ),
            b"[1, 2",
        ]
    )
    checked = _check(content)
    assert [(e["line"], e["code"]) for e in checked.errors] == [
        (2, "duplicate_custom_id"),
        (3, "model_not_found"),
        (4, "invalid_request"),
        (5, "invalid_json_line"),
    ]
    assert "suffix" in checked.errors[2]["message"]


def test_an_empty_file_fails() -> None:
    checked = _check(b"\n \n")
    assert [e["code"] for e in checked.errors] == ["empty_file"]


def test_a_line_too_large_for_the_bus_is_an_error_of_its_own() -> None:
    """A prompt within the schema's 4,000,000 characters can still be more bytes than a
    Kafka record holds (two bytes a character here): the line is refused by name, where
    the producer's send would fail the whole job."""
    big = {"model": MODEL, "prompt": "\u00e9" * 2_200_000}
    content = b"\n".join(
        [
            orjson.dumps({"custom_id": "big", "url": "/v1/completions", "body": big}),
            orjson.dumps(
                {"custom_id": "ok", "url": "/v1/completions", "body": {**big, "prompt": "hi"}}
            ),
        ]
    )
    checked = _check(content)
    assert [(e["line"], e["code"]) for e in checked.errors] == [(1, "request_too_large")]
    assert f"{MAX_VALUE_BYTES:,}" in checked.errors[0]["message"]
    assert [j.custom_id for j in checked.jobs] == ["ok"]


def _completion(**kw: object) -> Completion:
    base: dict[str, object] = {
        "request_id": "batch_x.4",
        "text": "hello",
        "finish_reason": FinishReason.LENGTH,
        "created_at": 1.0,
        "usage": Usage(prompt_tokens=2, completion_tokens=1),
    }
    return Completion.model_validate({**base, **kw})


def test_result_lines_in_openai_shapes() -> None:
    line, ok = result_line("c4", "/v1/chat/completions", MODEL, _completion())
    row = orjson.loads(line)
    assert ok and row["custom_id"] == "c4" and row["error"] is None
    assert row["response"]["status_code"] == 200
    assert row["response"]["body"]["choices"][0]["message"]["content"] == "hello"
    err = _completion(
        finish_reason=FinishReason.ERROR, error=ErrorInfo(code="invalid_request", message="bad")
    )
    line, ok = result_line("c4", "/v1/completions", MODEL, err)
    row = orjson.loads(line)
    assert not ok and row["error"] is None
    assert row["response"]["status_code"] == 400
    assert row["response"]["body"]["error"]["code"] == "invalid_request"
    line, ok = result_line(
        "c4", "/v1/completions", MODEL, _completion(finish_reason=FinishReason.CANCELLED)
    )
    row = orjson.loads(line)
    assert not ok and row["response"] is None and row["error"]["code"] == "batch_cancelled"


def test_foreign_request_ids_name_no_batch_line() -> None:
    for rid in ("cmpl-1234", "bulk-abc", "batch_x", "batch_x.", "batch_x.a"):
        assert parse_request_id(rid) is None


def test_batch_record_round_trips_through_a_hash() -> None:
    rec = BatchRecord(
        id="batch_x",
        tenant="acme",
        endpoint="/v1/completions",
        input_file_id="file-1",
        model=MODEL,
        created_at=10,
        expires_at=20,
        metadata={"k": "v"},
        errors=[{"code": "x", "line": 1}],
        total=3,
        completed=2,
    )
    raw = {k.encode(): v for k, v in rec.to_hash().items()}
    back = BatchRecord.from_hash(raw)
    assert back == rec
    body = back.to_openai()
    assert body["request_counts"] == {"total": 3, "completed": 2, "failed": 0}
    assert body["errors"] == {"object": "list", "data": [{"code": "x", "line": 1}]}
    assert body["output_file_id"] is None and body["object"] == "batch"
