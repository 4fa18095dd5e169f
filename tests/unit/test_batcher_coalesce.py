"""The batcher's coalesced misses (pure): followers grouped by marker are answered from
their leader's entry, follow a new holder, take a failed leader's place one at a time,
are generated past their deadline, and are never lost on the way."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.batcher.coalesce import Follower, Following, Seen

M = "tw:cache:{acme}:f:0:abc"


def follower(name: str, deadline: float = 100.0, may_lead: bool = True) -> Follower[str]:
    return Follower(name, f"rid-{name}", may_lead, deadline)


def following(*names: str, leader: str = "rid-lead") -> Following[str]:
    f: Following[str] = Following()
    for n in names:
        f.follow(M, "acme", "abc", leader, follower(n))
    return f


def test_an_entry_answers_every_follower_and_ends_the_group() -> None:
    f = following("a", "b", "c")
    assert len(f) == 3
    out = f.settle({M: Seen("rid-lead", leader_done=True, entry=b"[]")}, now=1.0)
    assert out.answered == [("a", b"[]"), ("b", b"[]"), ("c", b"[]")]
    assert out.generate == [] and out.handovers == []
    assert len(f) == 0 and f.groups == {}


def test_followers_wait_while_the_leader_runs() -> None:
    f = following("a", "b")
    out = f.settle({M: Seen("rid-lead", leader_done=False, entry=None)}, now=1.0)
    assert (out.answered, out.generate, out.handovers) == ([], [], [])
    assert len(f) == 2


def test_a_group_not_looked_at_still_has_its_deadlines_applied() -> None:
    f: Following[str] = Following()
    f.follow(M, "acme", "abc", "rid-lead", follower("early", deadline=5.0))
    f.follow(M, "acme", "abc", "rid-lead", follower("late", deadline=50.0))
    out = f.settle({}, now=10.0)  # Redis away: nothing seen
    assert out.generate == ["early"] and len(f) == 1


def test_a_new_holder_is_followed() -> None:
    f = following("a")
    out = f.settle({M: Seen("rid-other", leader_done=True, entry=None)}, now=1.0)
    assert (out.answered, out.generate, out.handovers) == ([], [], [])
    assert f.groups[M].leader == "rid-other"


def test_a_leader_that_ended_without_an_answer_hands_over_to_one_follower() -> None:
    f = following("a", "b", "c")
    out = f.settle({M: Seen("rid-lead", leader_done=True, entry=None)}, now=1.0)
    [h] = out.handovers
    assert h.failed == "rid-lead" and h.candidate.item == "a" and out.generate == []
    assert len(f) == 2  # the candidate is out of the group while it claims
    # It took the marker: it is generated, the others follow it.
    assert f.handed(h, None) == "a"
    assert f.groups[M].leader == "rid-a" and len(f) == 2
    # Next look: its answer is there.
    out = f.settle({M: Seen("rid-a", leader_done=True, entry=b"x")}, now=2.0)
    assert [item for item, _ in out.answered] == ["b", "c"]


def test_a_candidate_beaten_to_the_marker_follows_the_winner() -> None:
    f = following("a", "b")
    [h] = f.settle({M: Seen(None, leader_done=False, entry=None)}, now=1.0).handovers
    assert f.handed(h, "rid-edge-follower") is None
    assert f.groups[M].leader == "rid-edge-follower" and len(f) == 2


def test_a_lone_candidate_that_leads_leaves_no_group() -> None:
    f = following("a")
    [h] = f.settle({M: Seen(None, leader_done=False, entry=None)}, now=1.0).handovers
    assert M in f.groups  # kept while the claim is in flight
    assert f.handed(h, None) == "a" and f.groups == {}


def test_no_store_followers_never_lead() -> None:
    f: Following[str] = Following()
    f.follow(M, "acme", "abc", "rid-lead", follower("ns1", may_lead=False))
    f.follow(M, "acme", "abc", "rid-lead", follower("ok"))
    f.follow(M, "acme", "abc", "rid-lead", follower("ns2", may_lead=False))
    [h] = f.settle({M: Seen("rid-lead", leader_done=True, entry=None)}, now=1.0).handovers
    assert h.candidate.item == "ok"
    only: Following[str] = Following()
    only.follow(M, "acme", "abc", "rid-lead", follower("ns", may_lead=False))
    out = only.settle({M: Seen(None, leader_done=False, entry=None)}, now=1.0)
    assert out.generate == ["ns"] and out.handovers == [] and only.groups == {}


def test_a_group_dropped_during_a_claim_is_rebuilt_from_the_handover() -> None:
    f = following("a", "b")
    [h] = f.settle({M: Seen(None, leader_done=False, entry=None)}, now=1.0).handovers
    assert f.remove_if(lambda item: item == "b") == ["b"]
    assert f.groups == {}
    assert f.handed(h, "rid-x") is None
    g = f.groups[M]
    assert (g.scope, g.digest, g.leader, len(f)) == ("acme", "abc", "rid-x", 1)


looks = st.lists(
    st.tuples(
        st.sampled_from([None, "rid-lead", "rid-a", "rid-b", "rid-c", "rid-other"]),
        st.booleans(),
        st.booleans(),
        st.sampled_from([None, "rid-other"]),  # the handover's claim: taken or beaten
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(looks, st.lists(st.floats(0, 20), min_size=1, max_size=5))
def test_every_follower_ends_exactly_once(
    steps: list[tuple[str | None, bool, bool, str | None]], deadlines: list[float]
) -> None:
    """Whatever the looks say, each follower comes out once (answered, generated, or
    leading a handover) or is still waiting; none is lost or doubled."""
    names = [chr(ord("a") + i) for i in range(len(deadlines))]
    f: Following[str] = Following()
    for n, d in zip(names, deadlines, strict=True):
        f.follow(M, "acme", "abc", "rid-lead", Follower(n, f"rid-{n}", n != "b", d))
    out_items: list[str] = []
    for i, (holder, done, has_entry, claim) in enumerate(steps):
        seen = Seen(holder, done, b"e" if has_entry else None)
        out = f.settle({M: seen}, now=float(i * 2))
        out_items += [item for item, _ in out.answered] + out.generate
        for h in out.handovers:
            led = f.handed(h, claim)
            if led is not None:
                out_items.append(led)
        waiting = [fl.item for g in f.groups.values() for fl in g.followers]
        assert sorted(out_items + waiting) == names
    out = f.settle({}, now=1000.0)
    out_items += out.generate
    assert sorted(out_items) == names and f.groups == {}
