"""The pure parts of ``tokenwire dlq``: time arguments, choosing letters, naming them,
and which originals can be sent again."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from services.ops.dlq import (
    Letter,
    newest_per_request,
    parse_time,
    replayable,
    resolve,
    select,
    service_of,
)
from shared.codec import encode
from shared.dead_letters import COPY_BYTES, dead_letter
from shared.messages import DeadLetter, GenerateRequest
from shared.names import Names


def _letter(value: bytes, rid: str | None = None, topic: str = "tw.requests") -> DeadLetter:
    return dead_letter(
        reason="r",
        detail="",
        topic=topic,
        partition=0,
        offset=0,
        key=None,
        value=value,
        request_id=rid,
    )


def test_times_are_durations_back_from_now_or_iso() -> None:
    assert parse_time("90s", 1000.0) == 910.0
    assert parse_time("2h", 10_000.0) == 10_000.0 - 7200
    assert parse_time("1.5d", 200_000.0) == 200_000.0 - 1.5 * 86400
    naive = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
    assert parse_time("2026-01-02T03:04:05", 0) == naive  # no zone: UTC
    assert parse_time("2026-01-02T05:04:05+02:00", 0) == naive
    with pytest.raises(ValueError, match="not a duration"):
        parse_time("yesterday", 0)


def test_select_filters_by_time_and_reason_and_keeps_the_newest() -> None:
    req = encode(GenerateRequest(prompt="x"))
    letters = [
        Letter(0, i, 1000 * i, _letter(req).model_copy(update={"reason": r}))
        for i, r in enumerate(["a", "b", "a", "a"])
    ]
    assert [x.offset for x in select(letters, reason="a")] == [0, 2, 3]
    assert [x.offset for x in select(letters, since=2.0)] == [2, 3]
    assert [x.offset for x in select(letters, reason="a", limit=2)] == [2, 3]
    assert select([Letter(0, 9, 0, None)], reason="unreadable_dead_letter")[0].offset == 9


def test_an_id_is_partition_offset_or_the_newest_letter_of_a_request() -> None:
    req = GenerateRequest(prompt="x")
    a = Letter(0, 4, 100, _letter(encode(req), req.request_id))
    b = Letter(1, 2, 200, _letter(encode(req), req.request_id))
    other = Letter(0, 5, 300, _letter(b"junk"))
    assert resolve([a, b, other], "0:4") is a
    assert resolve([a, b, other], req.request_id) is b
    assert resolve([a, b, other], "7:7") is None and resolve([a], "nope") is None
    assert newest_per_request([a, b, other]) == [b, other]


def test_only_a_whole_intact_request_can_be_replayed() -> None:
    req = GenerateRequest(prompt="x")
    good = _letter(encode(req), req.request_id)
    assert replayable(good) is None
    big = GenerateRequest(prompt="y" * (COPY_BYTES + 10))
    assert "only the first" in (replayable(_letter(encode(big), big.request_id)) or "")
    tampered = good.model_copy(update={"original_b64": base64.b64encode(b"{}").decode()})
    assert "SHA-256" in (replayable(tampered) or "")
    assert "not a request" in (replayable(_letter(b"\xff\x00")) or "")
    assert "not the dead letter's" in (replayable(_letter(encode(req), "someone-else")) or "")


def test_the_service_is_known_by_the_topic_it_read() -> None:
    n = Names("tw")
    assert service_of(_letter(b"", topic=n.requests), n) == "batcher"
    assert service_of(_letter(b"", topic=n.batches), n) == "worker"
    assert service_of(_letter(b"", topic="elsewhere"), n) == "unknown"
