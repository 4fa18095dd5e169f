"""Routing on a Redis Cluster, on plain data: which key a command goes by, redirect replies,
the slot map read from CLUSTER SLOTS, and the hash tags that keep a request's keys (and a
tenant's cache keys) on one slot."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from shared import token_stream
from shared.messages import TokenEvent
from shared.names import Names
from shared.redis_client import RedisAccess
from shared.resp import RedisReplyError, Topology, key_of, redirect


def test_a_command_is_routed_by_its_first_key() -> None:
    assert key_of((b"XADD", b"tw:log:{r}", b"0-1", b"d", b"x")) == b"tw:log:{r}"
    assert key_of((b"EVAL", b"return 1", b"2", b"k1", b"k2", b"a")) == b"k1"
    assert key_of((b"EVALSHA", b"abc", b"0", b"a")) is None
    assert key_of((b"PING",)) is None


def test_redirect_replies_name_the_node() -> None:
    assert redirect(RedisReplyError("MOVED 3999 127.0.0.1:7002")) == ("MOVED", ("127.0.0.1", 7002))
    assert redirect(RedisReplyError("ASK 3999 10.0.0.5:7003")) == ("ASK", ("10.0.0.5", 7003))
    assert redirect(RedisReplyError("ERR wrong number of arguments")) is None
    assert redirect(b"OK") is None


def test_every_key_of_a_request_shares_its_slot() -> None:
    n = Names("tw", sharded=True)
    keys = [
        n.token_channel("r1"),
        n.token_log("r1"),
        n.done_marker("r1"),
        n.claim("r1"),
        n.takers("r1"),
        n.cancelled("r1"),
        n.owner("r1"),
    ]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert key_slot(n.token_log("r1").encode()) == key_slot(b"r1")
    assert n.tag_of(n.owner("cmpl-1")) == n.tag_of(n.token_log("cmpl-1").encode()) == "cmpl-1"
    tenant = [n.cache("acme", "gen"), n.cache_exact("acme", 3, "ab" * 8), n.cache("acme", "s", "3")]
    assert len({key_slot(k.encode()) for k in tenant}) == 1
    buckets = [n.rate_bucket("k1", "requests"), n.rate_bucket("k1", "tokens")]
    assert len({key_slot(k.encode()) for k in buckets}) == 1


@pytest.mark.parametrize("sharded", [False, True])
def test_token_events_publish_on_the_cluster_s_kind_of_channel(sharded: bool) -> None:
    n = Names("tw", sharded=sharded)
    ev = TokenEvent(request_id="r1", seq=0, text="a", token_ids=[1])
    cmds = token_stream.event_commands(n, [ev])
    assert [c[0] for c in cmds] == [b"XADD", b"EXPIRE", b"SPUBLISH" if sharded else b"PUBLISH"]


def test_the_slot_map_follows_cluster_slots() -> None:
    topo = Topology(RedisAccess("redis://10.0.0.1:7000/0", cluster=True))
    assert topo.stale  # nothing read yet
    reply = [
        [0, 5460, [b"10.0.0.1", 7000, b"id1"], [b"10.0.0.4", 7003, b"id4"]],
        [5461, 10922, [b"", 7001, b"id2"]],  # empty host: the node asked
        [10923, 16383, [b"10.0.0.3", 7002, b"id3"]],
    ]
    topo._read_slots(reply, ("10.0.0.9", 7000))
    topo.stale = False
    assert topo.masters == [("10.0.0.1", 7000), ("10.0.0.9", 7001), ("10.0.0.3", 7002)]
    for key in (b"tw:log:{a}", b"tw:log:{b}", b"tw:log:{c}", b"x"):
        slot = key_slot(key)
        want = 0 if slot <= 5460 else 1 if slot <= 10922 else 2
        assert topo.node_of(key) == topo.masters[want]
    topo._read_slots([[0, 100, [b"10.0.0.1", 7000, b"id1"]]], ("10.0.0.1", 7000))
    uncovered = next(k for k in (b"a", b"b", b"c", b"d") if key_slot(k) > 100)
    with pytest.raises(ConnectionError, match="no master"):
        topo.node_of(uncovered)
    topo.invalidate()
    assert topo.stale


def test_a_single_redis_serves_every_key() -> None:
    topo = Topology(RedisAccess("redis://127.0.0.1:6390/2"))
    assert not topo.stale
    assert topo.masters == [("127.0.0.1", 6390)]
    assert topo.node_of(b"anything") == ("127.0.0.1", 6390)
    topo.invalidate()
    assert not topo.stale
