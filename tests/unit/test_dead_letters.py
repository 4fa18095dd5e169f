"""The one dead-letter builder: a bounded copy of any message, with its size and digest,
that always encodes (and decodes) as a DeadLetter well under the bus's message limit."""

from __future__ import annotations

import base64
import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.codec import decode, encode
from shared.dead_letters import COPY_BYTES, dead_letter, dead_letter_key
from shared.kafka_io import MAX_VALUE_BYTES
from shared.messages import DeadLetter

WHERE = {"topic": "tw.requests", "partition": 3, "offset": 42}


def letter(value: bytes | None, **kw: object) -> DeadLetter:
    args: dict[str, object] = {
        "reason": "invalid",
        "detail": "prompt: field required",
        "key": b"req-1",
        "request_id": "req-1",
        **WHERE,
        **kw,
    }
    return dead_letter(value=value, **args)  # type: ignore[arg-type]


def test_a_small_message_is_copied_whole() -> None:
    dl = letter(b'{"prompt": 1}')
    assert base64.b64decode(dl.original_b64) == b'{"prompt": 1}'
    assert not dl.truncated
    assert dl.original_size == 13
    assert dl.original_sha256 == hashlib.sha256(b'{"prompt": 1}').hexdigest()
    assert (dl.topic, dl.partition, dl.offset, dl.key) == ("tw.requests", 3, 42, "req-1")


def test_a_large_message_keeps_its_first_bytes_its_size_and_its_digest() -> None:
    big = bytes(range(256)) * (12 * 1024)  # 3 MiB
    dl = letter(big)
    assert base64.b64decode(dl.original_b64) == big[:COPY_BYTES]
    assert dl.truncated
    assert dl.original_size == len(big)
    assert dl.original_sha256 == hashlib.sha256(big).hexdigest()


def test_a_message_of_exactly_the_copy_size_is_not_truncated() -> None:
    assert not letter(b"x" * COPY_BYTES).truncated
    assert letter(b"x" * (COPY_BYTES + 1)).truncated


def test_no_value_is_an_empty_copy() -> None:
    dl = letter(None, key=None, request_id=None)
    assert (dl.original_b64, dl.original_size, dl.truncated) == ("", 0, False)
    assert dl.original_sha256 == hashlib.sha256(b"").hexdigest()
    assert dl.key is None and dead_letter_key(dl) is None


def test_keys_of_any_bytes_become_bounded_text() -> None:
    assert letter(b"", key=b"\xff\xfeid").key == "\ufffd\ufffdid"
    assert letter(b"", key="text").key == "text"
    assert len(letter(b"", key=b"k" * 1_000_000).key or "") == 1024


def test_text_json_cannot_carry_is_replaced() -> None:
    dl = letter(b"", detail="lone \ud800 surrogate", request_id="\udfff")
    assert (dl.detail, dl.request_id) == ("lone ? surrogate", "?")
    assert decode(DeadLetter, encode(dl)) == dl


def test_a_letter_is_keyed_by_its_request_id_else_its_original_key() -> None:
    assert dead_letter_key(letter(b"", key=b"other", request_id="req-9")) == b"req-9"
    assert dead_letter_key(letter(b"", key=b"other", request_id=None)) == b"other"


def test_records_written_before_the_digest_fields_still_decode() -> None:
    old = b'{"reason":"invalid","topic":"t","partition":0,"offset":1,"original_b64":"eA=="}'
    dl = decode(DeadLetter, old)
    assert (dl.original_size, dl.original_sha256, dl.truncated) == (0, "", False)


def test_the_worst_case_letter_stays_small() -> None:
    control = "\x01" * 1_000_000  # each escapes to six bytes of JSON
    dl = letter(
        b"\x00" * 10_000_000,
        reason=control,
        detail=control,
        topic=control,
        key=control,
        request_id=control,
    )
    assert len(encode(dl)) < 128 * 1024 < MAX_VALUE_BYTES


@settings(max_examples=200, deadline=None)
@given(
    value=st.none() | st.binary(max_size=COPY_BYTES * 2),
    key=st.none() | st.binary(max_size=64) | st.text(max_size=64),
    text=st.text(max_size=64),
    request_id=st.none() | st.text(max_size=64),
)
def test_any_input_makes_a_letter_that_round_trips(
    value: bytes | None, key: bytes | str | None, text: str, request_id: str | None
) -> None:
    dl = letter(value, key=key, reason=text, detail=text, request_id=request_id)
    assert decode(DeadLetter, encode(dl)) == dl
    raw = value or b""
    assert raw.startswith(base64.b64decode(dl.original_b64))
    assert dl.original_size == len(raw)
    assert dl.truncated == (len(raw) > COPY_BYTES)
