"""Which worker generates a request: a claim key per request in Redis, taken, refreshed and
released only by its holder (each a server-side script, so a check and its write are one
step), with the set of worker processes that took it and did not end it cleanly.

A claim expires when its worker dies. A request taken by ``POISON_ATTEMPTS`` processes
that did not end it cleanly (they crashed while it ran) is a poison: the next taker
quarantines it instead of running it a third time. A process is counted once however often
it takes the request (a take retried across a Redis failover, a batch delivered back to it,
after its claim lapsed while Redis was away): a live worker is no crash."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from shared import token_stream
from shared.codec import DecodeError, decode
from shared.messages import TokenEvent
from shared.names import Names
from shared.redis_client import RedisAccess
from shared.resp import RedisReplyError, RespWriter
from shared.retry import transient_reply

# Processes that took a request without a clean end after which it is not run again.
POISON_ATTEMPTS = 2
TAKERS_TTL_S = 24 * 3600

# KEYS: done marker, cancelled marker, claim, replay log, takers.
# ARGV: this worker, claim TTL (ms), takers TTL (s), this process.
# Returns: done, cancelled, ours (1 when taken now or held before), the newest log entry,
# and the other processes that took it and did not end it cleanly.
_TAKE = b"""
local done = redis.call('EXISTS', KEYS[1])
local cancelled = redis.call('EXISTS', KEYS[2])
local holder = redis.call('GET', KEYS[3])
local ours = 0
if done == 0 and (not holder or holder == ARGV[1]) then
  if not holder then
    redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
  end
  redis.call('SADD', KEYS[5], ARGV[4])
  redis.call('EXPIRE', KEYS[5], ARGV[3])
  ours = 1
end
local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
return {done, cancelled, ours, last, redis.call('SCARD', KEYS[5]) - ours}
"""

# KEYS: claim. ARGV: this worker, claim TTL (ms). 1: still ours (taken again if Redis lost
# it), 0: another worker holds it now.
_REFRESH = b"""
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

# KEYS: claim, done marker, takers. ARGV: this worker, done TTL (s; 0: not finished), how it
# ends ('done', 'handed_back': this process's take ended cleanly, or 'crashed': it did not),
# this process.
_RELEASE = b"""
if ARGV[3] == 'done' then
  redis.call('SET', KEYS[2], '1', 'EX', ARGV[2])
  redis.call('DEL', KEYS[3])
elseif ARGV[3] == 'handed_back' then
  redis.call('SREM', KEYS[3], ARGV[4])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"""


@dataclass(frozen=True, slots=True)
class Claim:
    """What taking a request's claim found."""

    done: bool  # it finished before (a done marker): never generate it again
    cancelled: bool
    ours: bool  # this worker holds the claim (taken now, or before: a duplicate delivery)
    last_seq: int  # the newest event in its replay log, -1 if none
    crashed_attempts: int  # other processes that took it and did not end it cleanly
    # Its replay log ends with a final event: it ended, and its worker died while settling
    # it (its completion may have been acknowledged already).
    finished: bool = False

    @property
    def poison(self) -> bool:
        return self.ours and self.crashed_attempts >= POISON_ATTEMPTS


class Claims:
    """This worker's claims, over a raw-RESP connection of their own. Every call raises
    ``ConnectionError`` (or ``OSError``) while Redis is away: callers ride that out."""

    def __init__(
        self, redis_url: str | RedisAccess, names: Names, worker_id: str, claim_ttl_s: float
    ) -> None:
        self.names = names
        self.me = worker_id.encode()
        # This process, among the takers of a request (a restart under the same worker id
        # is another one).
        self.process = f"{worker_id}:{secrets.token_hex(8)}".encode()
        self.ttl_ms = b"%d" % int(claim_ttl_s * 1000)
        self.conn = RespWriter(redis_url, name=f"tw-worker-{worker_id}-claims")

    async def take(self, rids: list[str]) -> list[Claim]:
        """One round trip for all ``rids``."""
        n = self.names
        cmds = [
            _eval(
                _TAKE,
                [n.done_marker(r), n.cancelled(r), n.claim(r), n.token_log(r), n.takers(r)],
                [self.me, self.ttl_ms, b"%d" % TAKERS_TTL_S, self.process],
            )
            for r in rids
        ]
        out = []
        for res in await self._execute(cmds):
            done, cancelled, ours, last, before = res
            seq = token_stream.seq_of(last[0][0]) if last else -1
            finished = bool(last) and _final(last[0][1][1])
            claim = Claim(bool(done), bool(cancelled), bool(ours), seq, int(before), finished)
            out.append(claim)
        return out

    async def refresh(self, rids: list[str]) -> list[str]:
        """Extend the claims on ``rids``; returns those another worker holds now."""
        cmds = [_eval(_REFRESH, [self.names.claim(r)], [self.me, self.ttl_ms]) for r in rids]
        return [r for r, kept in zip(rids, await self._execute(cmds), strict=True) if not kept]

    async def release(self, rids: list[str], how: str, *, done_ttl_s: int = 0) -> None:
        """Give up this worker's claims on ``rids``, as ``how`` says they ended: ``done``
        (finished: each gets its done marker), ``handed_back`` (revoked or shutting down:
        not counted as a crashed attempt) or ``crashed`` (the engine failed under them)."""
        if how not in ("done", "handed_back", "crashed"):
            raise ValueError(f"unknown way for a claim to end: {how!r}")
        n, ttl, end = self.names, b"%d" % done_ttl_s, how.encode()
        cmds = [
            _eval(
                _RELEASE,
                [n.claim(r), n.done_marker(r), n.takers(r)],
                [self.me, ttl, end, self.process],
            )
            for r in rids
        ]
        await self._execute(cmds)

    async def _execute(self, cmds: list[tuple[bytes, ...]]) -> list[Any]:
        res = await self.conn.execute(cmds)
        for r in res:
            if transient_reply(r):  # out of memory or loading: the caller waits it out
                raise ConnectionError(f"redis: {r}")
            if isinstance(r, RedisReplyError):
                raise r
        return res

    async def aclose(self) -> None:
        await self.conn.aclose()


def _final(entry: bytes) -> bool:
    """Whether a replay-log entry is a final event (one that cannot be read is not)."""
    try:
        return decode(TokenEvent, entry).final
    except DecodeError:
        return False


def _eval(script: bytes, keys: list[str], args: list[bytes]) -> tuple[bytes, ...]:
    return (b"EVAL", script, b"%d" % len(keys), *(k.encode() for k in keys), *args)
