"""Batches under the bus's message limit (pure).

A batch encodes as its own few fields around the JSON list of its requests, each encoded
exactly as on its own, so its size is known before it is built: the envelope, plus each
request's size, plus one comma between two. Requests for one partition are packed in
order into as few batches as fit; a request that fits in no batch is too large to send.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from shared.kafka_io import MAX_VALUE_BYTES

# A batch's fields around its requests, less its batcher id: {"batch_id":"bat-<32 hex>",
# "created_at":<float>,"batcher_id":"","requests":[]} is about 110 bytes.
ENVELOPE_BYTES = 256


def request_room(batcher_id: str) -> int:
    """How many bytes the requests of one batch may take, separators included."""
    return MAX_VALUE_BYTES - ENVELOPE_BYTES - len(orjson.dumps(batcher_id))


def pack(sizes: Sequence[int], room: int) -> list[list[int]]:
    """The indices of ``sizes``, in order, cut into runs that each fit in ``room`` (a run
    takes its sizes plus one byte between two). A size over ``room`` gets a run of its
    own; callers keep such requests out."""
    runs: list[list[int]] = []
    used = 0
    for i, size in enumerate(sizes):
        if runs and used + 1 + size <= room:
            runs[-1].append(i)
            used += 1 + size
        else:
            runs.append([i])
            used = size
    return runs
