"""What "Redis is away" looks like to the edge, and how long to wait before trying again."""

from __future__ import annotations

import random
from typing import Final

import redis.exceptions

# A refused or dropped connection, or no reply in time: Redis (or the way to it) is away.
# Anything else Redis answers (a wrong type, out of memory) is not an outage.
REDIS_DOWN: Final = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
    TimeoutError,
)


def backoff(failures: int, *, first_s: float = 0.05, cap_s: float = 2.0) -> float:
    """Seconds to wait after ``failures`` failed tries (0: the first): doubling up to
    ``cap_s``, each drawn from its upper half so many waiters do not retry in step."""
    ceiling = min(cap_s, first_s * 2 ** min(failures, 30))
    return random.uniform(ceiling / 2, ceiling)
