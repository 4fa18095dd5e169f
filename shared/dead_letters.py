"""Dead letters: how every service records a message it will not serve.

A dead letter says why, where the message came from, and holds a bounded copy of it: the
first ``COPY_BYTES`` bytes in base64, with the whole message's size and SHA-256. However
large or strange the message, its dead letter stays far below the bus's message limit, so
writing it can never fail the way the message did."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from aiokafka.structs import ConsumerRecord

from shared.messages import DeadLetter

COPY_BYTES = 64 * 1024  # 85 KiB in base64
DETAIL_CHARS = 4096
KEY_CHARS = 1024
SHORT_CHARS = 256  # reason, topic, request id


def dead_letter(
    *,
    reason: str,
    detail: str,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | str | None,
    value: bytes | None,
    request_id: str | None,
) -> DeadLetter:
    """The dead letter of a message read from ``topic`` at ``partition``/``offset``.

    Refuses nothing: any bytes, any key, any text (cut to bounded lengths, characters that
    cannot be encoded replaced). Its JSON encoding stays under 128 KiB."""
    raw = value or b""
    head = raw[:COPY_BYTES]
    if isinstance(key, bytes):
        key = key[: KEY_CHARS * 4].decode("utf-8", "replace")
    return DeadLetter(
        reason=_text(reason, SHORT_CHARS),
        detail=_text(detail, DETAIL_CHARS),
        topic=_text(topic, SHORT_CHARS),
        partition=partition,
        offset=offset,
        key=None if key is None else _text(key, KEY_CHARS),
        original_b64=base64.b64encode(head).decode("ascii"),
        original_size=len(raw),
        original_sha256=hashlib.sha256(raw).hexdigest(),
        truncated=len(head) < len(raw),
        request_id=None if request_id is None else _text(request_id, SHORT_CHARS),
    )


def dead_letter_of_record(
    record: ConsumerRecord[Any, Any], reason: str, detail: str, request_id: str | None
) -> DeadLetter:
    """The dead letter of a Kafka record as it was consumed."""
    return dead_letter(
        reason=reason,
        detail=detail,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        request_id=request_id,
    )


def dead_letter_key(letter: DeadLetter) -> bytes | None:
    """The Kafka key to send a dead letter under: its request id, else the original key
    (both bounded), so letters about one request share a partition."""
    key = letter.request_id or letter.key
    return key.encode() if key else None


def _text(text: str, limit: int) -> str:
    """At most ``limit`` characters that JSON can carry (a lone surrogate becomes '?')."""
    return text[:limit].encode("utf-8", "replace").decode("utf-8")
