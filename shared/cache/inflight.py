"""In-flight markers of exact-cache misses being generated, shared by the edges and the
batchers so identical misses coalesce whichever path they came by.

A marker (``Names.cache(scope, "f", generation, digest)``) holds the request id of the
one miss generating the answer (the leader), for at most the coalescing wait. An
identical miss that finds it follows that leader: it waits for the entry the leader's
worker stores, and takes the marker over when the leader ends without one.
"""

from __future__ import annotations

from shared.names import Names

# KEYS[1]: the in-flight marker; ARGV: this request's id, the marker's TTL in ms, whether
# it may take the marker ('1': its answer will be stored), the id of a holder to replace
# ('' for none: a leader that failed). Returns the holder's id, or false when this request
# now holds the marker (or, not allowed to take it, no one does).
CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and holder == ARGV[4] then
    redis.call('DEL', KEYS[1])
    holder = false
end
if holder or ARGV[3] ~= '1' then
    return holder
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""
# KEYS[1]: the in-flight marker; ARGV[1]: the id that must hold it for it to be deleted.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


def marker_key(names: Names, scope: str, generation: int, digest: str) -> str:
    """The in-flight marker of entry ``digest`` of ``scope`` at ``generation``."""
    return names.cache(scope, "f", str(generation), digest)


def claim_args(request_id: str, wait_s: float, may_lead: bool, failed: str = "") -> list[str]:
    """``CLAIM``'s arguments: the marker lasts the coalescing wait ``wait_s``."""
    ttl_ms = max(1, int(wait_s * 1000))
    return [request_id, str(ttl_ms), "1" if may_lead else "0", failed]


def text(raw: bytes | str) -> str:
    """A marker's holder as text (clients may or may not decode replies)."""
    return raw.decode() if isinstance(raw, bytes) else raw
