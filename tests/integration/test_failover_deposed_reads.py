"""A deposed async master serves none of its own term's writes that no slave fetched.

Chaos campaign seed 2007: an async master whose link went down wrote a message no slave
fetched; a slave took over and wrote another message at that offset; on the way back the
old master, not yet truncated against the new one, served its own message to a reader.

Async pair A (founder) / B (slave 1), ZK session 1.5 s, each stopped with SIGSTOP in turn:

1. A stopped: B takes over (epoch e2) and A, resumed, follows it (so B has followed a master
   before, like the chaos run's old master: a masterless slave then serves its whole log).
2. ``shared`` put on B and replicated to A; A stopped; ``b-1..3`` put on B, acked (and
   readable on B while it leads, the documented async read caveat). A fetch A had parked
   on B may still carry ``b-1`` into A's socket buffer; the others reach no slave.
3. B stopped, A resumed: A takes over (epoch e3) without (most of) them. A stopped again so that
   B, resumed, cannot truncate against it: B is deposed (orphaned or following, not yet
   truncated) with those writes still at the end of its log.
4. Reads from B must return none of those A lacks (the old code returned them), but still ``shared``.
5. A resumed, ``a-own`` acked by A at that offset; once B follows A, B serves ``a-own`` there.
"""

from __future__ import annotations

from metaq.tools.launcher import wait_until

from .failover_support import (
    TOPIC,
    Group,
    async_system,
    fetch_all,
    first_ack_after,
    make_pair,
    put_one,
    stat,
    wait_follows,
    wait_leads,
)
from .replication_support import wait_caught_up


def test_a_deposed_async_master_serves_no_write_only_it_held(broker_factory, zk_client, zk_root):  # type: ignore[no-untyped-def]
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, async_system(), group)

    # 1. B leads once, A follows it.
    a.pause()
    try:
        e2 = wait_leads(b, group, group.epoch())
    finally:
        a.resume()
    wait_follows(a, b, group)

    # 2. A write A holds, and one only B holds.
    shared = put_one(b, b"shared")
    assert shared.code == 200, shared.header
    wait_caught_up(b, a, [(TOPIC, 0)])
    a.pause()
    paused = [a]
    try:
        # A fetch A had parked on B may still carry the first of these into A's socket
        # buffer; the later ones reach no slave.
        b_offsets = {}
        for payload in (b"b-1", b"b-2", b"b-3"):
            reply = put_one(b, payload)
            assert reply.code == 200, reply.header
            b_offsets[int(reply["offset"])] = payload
        on_b = fetch_all(b)
        assert all(on_b.get(offset) == payload for offset, payload in b_offsets.items()), "an async master serves what it flushed"

        # 3. A takes over without it; stopped again, it cannot be B's truncation point.
        b.pause()
        paused.append(b)
        a.resume()
        paused.remove(a)
        wait_leads(a, group, e2)
        taken_back = sorted(set(b_offsets) - set(fetch_all(a)))
        assert taken_back, f"A took over with all of B's writes {b_offsets}: nothing to take back"
        a.pause()
        paused.append(a)
        b.resume()
        paused.remove(b)
        wait_until(lambda: stat(b, "ha_state") in ("orphaned", "following"), 20, interval=0.05,
                   message="B deposed (no longer acting master)")

        # 4. Deposed, not yet truncated: B serves what A fetched, and nothing of its own past it.
        for _ in range(5):
            on_b = fetch_all(b)
            assert b"shared" in on_b.values(), on_b
            assert not set(taken_back) & set(on_b), f"the deposed master served writes no slave had: {on_b}"
            assert stat(b, "ha_state") in ("orphaned", "following"), "still deposed while read"
    finally:
        for broker in paused:
            broker.resume()

    # 5. A's own write at that offset is what B serves once it follows A.
    reply, _ = first_ack_after(a, b"a-own")
    wait_follows(b, a, group)
    wait_caught_up(a, b, [(TOPIC, 0)])
    on_b = fetch_all(b)
    assert int(reply["offset"]) == taken_back[0] and on_b.get(taken_back[0]) == b"a-own", (on_b, reply.header)
