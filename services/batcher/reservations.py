"""Reserving worker slots in Redis, shared by every batcher (``slots.SlotLedger``'s rules,
run atomically by a Lua script on one hash per worker)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from services.batcher.slots import Grant
from shared.messages import WorkerHeartbeat
from shared.names import Names

# KEYS[1]: the worker's ledger. ARGV: heartbeat at, its free slots, now, slots wanted,
# transit margin (s), ledger time to live (ms), this reservation's token.
LUA = """
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '-1')
local free
if tonumber(ARGV[1]) > epoch then
  epoch = tonumber(ARGV[1])
  free = tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'free', ARGV[2])
else
  free = tonumber(redis.call('HGET', KEYS[1], 'free'))
end
local cutoff = epoch - tonumber(ARGV[5])
local used = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = all[i]
  if f ~= 'epoch' and f ~= 'free' then
    local at, n = string.match(all[i + 1], '^(%S+) (%S+)$')
    if tonumber(at) <= cutoff then
      redis.call('HDEL', KEYS[1], f)
    else
      used = used + tonumber(n)
    end
  end
end
local granted = math.min(tonumber(ARGV[4]), free - used)
if granted < 0 then granted = 0 end
if granted > 0 then
  redis.call('HSET', KEYS[1], ARGV[7], ARGV[3] .. ' ' .. granted)
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {granted, free - used - granted}
"""


class SlotReserver:
    """Reserves slots on several workers in one round trip (a pipeline of EVALSHA calls;
    the script is loaded once, and again if Redis lost it). A Redis Cluster's pipelines
    take no EVALSHA: there each call sends the script (Redis caches it by its digest)."""

    def __init__(self, names: Names, batcher_id: str, margin_s: float, ledger_ttl_s: float) -> None:
        self.names = names
        self.batcher_id = batcher_id
        self.margin_s = margin_s
        self.ttl_ms = int(ledger_ttl_s * 1000)
        self._seq = itertools.count()
        self._sha: str | None = None

    async def reserve(
        self, client: aioredis.Redis, wants: Sequence[tuple[WorkerHeartbeat, int]], now: float
    ) -> dict[str, Grant]:
        """Slots granted on each worker (by worker id) to this batcher's ``wants``."""
        cluster = isinstance(client, RedisCluster)
        if self._sha is None and not cluster:
            self._sha = await client.script_load(LUA)
        pipe = client.pipeline(transaction=False)
        for hb, want in wants:
            token = f"{self.batcher_id}:{next(self._seq)}"
            key = self.names.slot_ledger(hb.worker_id)
            args = (repr(hb.at), hb.free_slots, repr(now), want, self.margin_s, self.ttl_ms, token)
            if self._sha is None:
                pipe.eval(LUA, 1, key, *args)
            else:
                pipe.evalsha(self._sha, 1, key, *args)
        try:
            replies = await pipe.execute()
        except NoScriptError:  # Redis restarted: a reservation not run, nothing to undo
            self._sha = None
            return await self.reserve(client, wants, now)
        return {
            hb.worker_id: Grant(int(granted), int(left))
            for (hb, _), (granted, left) in zip(wants, replies, strict=True)
        }
