"""Per-key token buckets in Redis: requests per minute and tokens per minute.

One Lua script checks and takes from both buckets atomically, with Redis's clock, so any
number of edges share the limits exactly. A bucket holds a minute's allowance and refills
continuously; a request that does not fit takes nothing and learns how long to wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis

from shared.names import Names

# KEYS: the requests bucket, the tokens bucket.
# ARGV: per bucket (capacity, cost) ×2, then the keys' TTL in ms. Capacity 0: unlimited.
# Returns {1, 0} when taken, {0, wait_ms} when not yet, {-1, 0} when the cost exceeds the
# capacity (it never fits).
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[5])
local levels = {}
local wait = 0
for i = 1, 2 do
  local cap = tonumber(ARGV[2 * i - 1])
  local cost = tonumber(ARGV[2 * i])
  if cap > 0 then
    if cost > cap then return {-1, 0} end
    local rate = cap / 60000.0
    local v = redis.call('HMGET', KEYS[i], 'l', 't')
    local level = cap
    if v[1] then
      level = math.min(cap, tonumber(v[1]) + (now - tonumber(v[2])) * rate)
    end
    levels[i] = level
    if level < cost then
      wait = math.max(wait, math.ceil((cost - level) / rate))
    end
  end
end
if wait > 0 then return {0, wait} end
for i = 1, 2 do
  if levels[i] then
    redis.call('HSET', KEYS[i], 'l', tostring(levels[i] - tonumber(ARGV[2 * i])), 't', now)
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return {1, 0}
"""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A rate limiter's answer for one request: allowed, or when to retry (never: it can not fit at all)."""

    allowed: bool
    retry_after_s: float = 0.0
    never: bool = False  # the cost exceeds a bucket's whole capacity


class RateLimiter:
    """Token buckets of ``requests_per_min`` and ``tokens_per_min`` per key: the edge's
    defaults, or a key's own limits where its policy sets them."""

    def __init__(
        self, redis: aioredis.Redis, names: Names, requests_per_min: int, tokens_per_min: int
    ) -> None:
        self._names = names
        self.requests_per_min = requests_per_min
        self.tokens_per_min = tokens_per_min
        self._script = redis.register_script(_SCRIPT)

    def limits(self, requests_per_min: int | None, tokens_per_min: int | None) -> tuple[int, int]:
        """The (requests, tokens) per minute that apply: a key's own, else the defaults."""
        return (
            self.requests_per_min if requests_per_min is None else requests_per_min,
            self.tokens_per_min if tokens_per_min is None else tokens_per_min,
        )

    async def take(
        self,
        key_id: str,
        tokens: int,
        *,
        requests_per_min: int | None = None,
        tokens_per_min: int | None = None,
    ) -> Verdict:
        """Take one request and ``tokens`` tokens from ``key_id``'s buckets, or neither."""
        rpm, tpm = self.limits(requests_per_min, tokens_per_min)
        if rpm <= 0 and tpm <= 0:
            return Verdict(True)
        keys = [
            self._names.rate_bucket(key_id, "requests"),
            self._names.rate_bucket(key_id, "tokens"),
        ]
        args = [rpm, 1, tpm, tokens, 120_000]
        ok, wait_ms = await self._script(keys=keys, args=args)
        if ok == 1:
            return Verdict(True)
        if ok == -1:
            return Verdict(False, 60.0, never=True)
        return Verdict(False, int(wait_ms) / 1000)
