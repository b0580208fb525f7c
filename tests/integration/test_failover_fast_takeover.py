"""The fast takeover (metaq/ha/takeover.py, docs/failover.md "Fast takeover") with real processes.

A sync pair A (master) / B (slave 1) on the shared test ZooKeeper, ``zk.zkSessionTimeoutMs``
1500 ms unless said otherwise. Which path a failover took is read from B itself (its stats
``ha_fast_takeovers`` and its log), never from a wall-clock bound:

* ``kill -9`` of A, security on: B deposes A's session at once (fast path), nothing acked is
  lost, writes and reads come back on B; A never returns (the fault never heals);
* ``SIGSTOP`` of A (alive, paused; its port still accepts connections): the fast path does
  not fire, B takes over when A's session expires, as before;
* the link to A cut by the fault proxy (its listener closed: B's connections are closed and
  its connects refused, while A lives and holds its ZooKeeper session): A answers B's
  challenge through ZooKeeper and is not deposed, A keeps acking, and B follows it again
  once the link heals;
* A killed and restarted on the same port before B acts (B paused meanwhile): the new A
  accepts connections, so B does not depose it; the group gets a master through the
  session-timeout path and nothing acked is lost.
"""

from __future__ import annotations

import time
from typing import Any

from metaq.record import encode_batch
from metaq.security.handshake import ClientAuthenticator
from metaq.tools.launcher import wait_until
from metaq.zk.embedded import free_port

from .failover_support import (
    SESSION_MS,
    TOPIC,
    Group,
    PutStream,
    async_system,
    fetch_all,
    first_ack_after,
    make_pair,
    missing_acks,
    put_one,
    stat,
    sync_system,
    wait_follows,
    wait_in_sync_set,
    wait_leads,
)
from .trust_support import PASSWORDS, SecuredGroup, request_as, run

FAST_LINE = "took over from the dead master at"
NOT_DEPOSED_LINE = "not deposing the master at"


def _fast_takeovers(broker: Any) -> int:
    return int(stat(broker, "ha_fast_takeovers") or 0)


def _pair_under_load(broker_factory, zk_client, zk_root, system: dict[str, Any], acked: int = 100):
    """A (master) and B (slave 1), a put stream on A with ``acked`` puts acked: (group, a, b, epoch, stream)."""
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, system, group)
    epoch_before = group.epoch()
    stream = PutStream(a.address, tag="a").start()
    stream.wait_acked(acked)
    return group, a, b, epoch_before, stream


# --- kill -9: the fast path, with security on -------------------------------------------------


def _put_as_app(broker: Any, payload: bytes) -> Any:
    header = {"op": "put", "topic": TOPIC, "partition": 0}
    return run(request_as(broker, "app", header, encode_batch([(payload, None)])))


def _stats_as_ops(broker: Any) -> dict[str, str]:
    reply = run(request_as(broker, "ops", {"op": "stats"}))
    pairs = (line.partition(" ") for line in reply.body.decode().splitlines())
    return {key: value for key, _, value in pairs}


def test_kill_master_takes_the_fast_path_secured(broker_factory, zk_client, zk_root, tmp_path):
    security = SecuredGroup(tmp_path / "security")
    group = Group(zk_client, zk_root)
    a = broker_factory(0, {TOPIC: 1}, sync_system(**security.system), name="A", zookeeper={"zk.zkSessionTimeoutMs": SESSION_MS})
    b = broker_factory(0, {TOPIC: 1}, sync_system(**security.system), {"slaveId": 1}, name="B",
                       zookeeper={"zk.zkSessionTimeoutMs": SESSION_MS})
    wait_in_sync_set(group, 1)
    epoch_before = group.epoch()

    acked: dict[int, bytes] = {}
    for n in range(40):
        payload = f"before-{n}".encode()
        reply = _put_as_app(a, payload)
        assert reply.code == 200, reply.header
        acked[int(reply["offset"])] = payload
    a.kill()  # never restarted: a fault that never heals

    def acked_on_b() -> Any:
        try:
            reply = _put_as_app(b, b"first-on-B")
        except Exception:
            return None
        return reply if reply.code == 200 else None

    first = wait_until(acked_on_b, 20, interval=0.02, message="a put acked by B")
    assert group.epoch() > epoch_before and group.master() == b.url
    stats = _stats_as_ops(b)
    assert stats["ha_fast_takeovers"] == "1", stats
    log = b.log_text()
    assert FAST_LINE in log and "its port refuses connections and its ZooKeeper session" in log

    # Nothing acked in sync mode is lost; reads and writes come back on B.
    on_b = fetch_all(b, authenticator=ClientAuthenticator("app", PASSWORDS["app"]))
    assert all(on_b.get(offset) == payload for offset, payload in acked.items())
    assert on_b[int(first["offset"])] == b"first-on-B"
    for n in range(10):
        assert _put_as_app(b, f"after-{n}".encode()).code == 200


# --- SIGSTOP: a paused master is alive; the fast path must not fire --------------------------


def test_paused_master_keeps_the_session_timeout_path(broker_factory, zk_client, zk_root):
    group, a, b, epoch_before, stream = _pair_under_load(broker_factory, zk_client, zk_root, sync_system())
    stopped_at = time.monotonic()
    a.pause()
    try:
        _, acked_at = first_ack_after(b, b"first-on-B", timeout=30)
        wait_leads(b, group, epoch_before)
        # The session path: B took over only once A's session expired, not on evidence.
        assert acked_at - stopped_at >= SESSION_MS / 1000 * 0.9
        assert _fast_takeovers(b) == 0
        assert FAST_LINE not in b.log_text()
    finally:
        a.resume()  # its puts in flight end (fenced), so the stream can stop
    stream.stop()
    assert not missing_acks(stream.acked, fetch_all(b))
    assert put_one(b, b"more").code == 200
    # A wakes up fenced, then follows B.
    wait_follows(a, b, group)


# --- a cut link: connects refused by a closed proxy listener while A lives ---------------------


def test_cut_link_refusing_connections_does_not_depose_a_live_master(broker_factory, zk_client, zk_root):
    from chaos.proxy import ProxyThread
    from chaos.toxiproxy_client import client_for

    group = Group(zk_client, zk_root)
    with ProxyThread() as server:
        toxi = client_for(server.url)
        listen = f"127.0.0.1:{free_port('127.0.0.1')}"
        a_port = free_port("127.0.0.1")
        # B reaches A only through the proxy (A advertises the proxy's address).
        proxy = toxi.create(upstream=f"127.0.0.1:{a_port}", name="peer-a", listen=listen)
        a = broker_factory(0, {TOPIC: 1}, sync_system(serverPort=a_port, advertisedAddress=listen), name="A",
                           zookeeper={"zk.zkSessionTimeoutMs": SESSION_MS}, start=False)
        a.start(wait_zk=False)
        wait_until(lambda: group.master() == f"meta://{listen}", 30, interval=0.05, message="A to lead at its proxy's address")
        b = broker_factory(0, {TOPIC: 1}, sync_system(), {"slaveId": 1}, name="B",
                           zookeeper={"zk.zkSessionTimeoutMs": SESSION_MS})
        wait_in_sync_set(group, 1)
        epoch_before, master_before = group.epoch(), group.master()
        assert put_one(a, b"before-cut").code == 200

        proxy.disable()  # B's connections to A closed, its connects refused; A is alive
        wait_until(lambda: NOT_DEPOSED_LINE in b.log_text(), 10, interval=0.05, message="B to decide not to depose A")
        assert "so it lives (only our link to it is cut)" in b.log_text()
        # Two session timeouts later A still leads its epoch and acks (the sync set degrades).
        time.sleep(2 * SESSION_MS / 1000)
        assert group.epoch() == epoch_before and group.master() == master_before
        assert _fast_takeovers(b) == 0
        wait_until(lambda: put_one(a, b"during-cut").code == 200, 15, interval=0.1, message="A to ack during the cut")

        proxy.enable()
        wait_in_sync_set(group, 1, timeout=30)
        assert group.epoch() == epoch_before
        # B watches A again: should A's process die now, the fast path applies.
        wait_until(lambda: stat(b, "ha_death_watch") == "watching", 10, interval=0.1, message="B to watch A again")


# --- a master restarted on its port before the slave acts: alive, not deposed -----------------


def test_master_restarted_on_its_port_is_not_deposed(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    long_session = {"zk.zkSessionTimeoutMs": 4000}
    a = broker_factory(0, {TOPIC: 1}, sync_system(), name="A", zookeeper=long_session)
    b = broker_factory(0, {TOPIC: 1}, sync_system(), {"slaveId": 1}, name="B", zookeeper=long_session)
    wait_follows(b, a, group)
    wait_in_sync_set(group, 1)
    epoch_before = group.epoch()
    stream = PutStream(a.address, tag="a").start()
    stream.wait_acked(100)
    b.pause()  # B cannot act until A is back
    try:
        a.kill()
        stream.stop()
        a.start(wait_zk=False)  # same port: it accepts connections again
    finally:
        b.resume()
    # B's watch connection to the old process is gone, but the port answers: not deposed.
    # A's old session expires; whoever then wins (A led the last epoch, B is in the sync set)
    # holds every acked message.
    wait_until(lambda: group.epoch() > epoch_before and group.master() in (a.url, b.url), 30,
               interval=0.1, message="a new epoch after A's old session expired")
    assert _fast_takeovers(b) == 0 and FAST_LINE not in b.log_text()
    # B saw the restarted process alive either way: its death watch found the port accepting
    # connections, or its fetches found a broker there that answers as not the acting master
    # (ha/answerer.py), and it asked ZooKeeper instead of deposing anyone.
    assert ("it closed our connection, but its port accepts connections" in b.log_text()
            or "is not the acting master of epoch" in b.log_text()), b.log_text()[-3000:]
    leader = a if group.master() == a.url else b
    _, _ = first_ack_after(leader, b"after-restart", timeout=20)
    assert not missing_acks(stream.acked, fetch_all(leader))


# --- two sync slaves race on the same evidence: the epoch's compare-and-set decides -----------


def test_two_slaves_race_one_wins_the_other_follows(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    c = broker_factory(0, {TOPIC: 1}, sync_system(), {"slaveId": 2}, name="C", zookeeper={"zk.zkSessionTimeoutMs": SESSION_MS})
    wait_follows(c, a, group)
    wait_in_sync_set(group, 2)
    epoch_before = group.epoch()
    stream = PutStream(a.address, tag="a").start()
    stream.wait_acked(200)
    a.kill()
    stream.stop()

    wait_until(lambda: group.master() in (b.url, c.url), 20, interval=0.05, message="B or C to lead")
    winner, loser = (b, c) if group.master() == b.url else (c, b)
    wait_leads(winner, group, epoch_before)
    assert group.epoch() == epoch_before + 1, "exactly one takeover"
    assert _fast_takeovers(winner) == 1 and _fast_takeovers(loser) == 0
    wait_follows(loser, winner, group)
    _, _ = first_ack_after(winner, b"after-race")
    assert not missing_acks(stream.acked, fetch_all(winner))


# --- async mode: the fast path, with the new master's acks held until the old lease ran out ----


def _logged_at(log: str, needle: str) -> float:
    """The time of the first log line containing ``needle`` (seconds of the day)."""
    line = next(line for line in log.splitlines() if needle in line)
    clock = line.split(" ")[1].replace(",", ".")
    hours, minutes, seconds = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def test_async_kill_takes_the_fast_path_and_holds_acks_for_half_a_session(broker_factory, zk_client, zk_root):
    group, a, b, epoch_before, stream = _pair_under_load(broker_factory, zk_client, zk_root, async_system())
    a.kill()
    stream.stop()
    first_ack_after(b, b"first-on-B")
    wait_leads(b, group, epoch_before)
    assert _fast_takeovers(b) == 1
    log = b.log_text()
    dead_at = _logged_at(log, "is dead: its connection dropped")
    # Logged once the lease started (it runs right after the hold), before any ack.
    leading_at = _logged_at(log, f"transactions reconciled in epoch {epoch_before + 1}")
    # An old master that had not yet seen its ZooKeeper connection go could ack alone until
    # its lease ran out: the new one takes writes only T/2 after the evidence.
    assert leading_at - dead_at >= SESSION_MS / 2000 - 0.01, (dead_at, leading_at)
    assert put_one(b, b"more").code == 200



def test_async_candidate_waiting_for_a_silent_slave_still_takes_the_fast_path(broker_factory, zk_client, zk_root):
    """Async failover ranks the slaves by log end: a candidate waits up to CANDIDATE_WAIT_S
    for every live slave's log end, polling. C is paused (alive to ZooKeeper, silent) when A
    is killed. Each of B's polls reads a master node that still names A's dead session; the
    poll must bring B back to the election rules, which let it go once the wait is over: the
    fast path, well before A's session (4 s here) expires. Ignored, B's wait stopped at its
    first poll and it took over only when A's node went (no fast takeover) -- and beside a
    live master whose challenge was answered late, it stayed an orphan until some other
    ZooKeeper event came (campaign seed 7102: 2 minutes)."""
    zookeeper = {"zk.zkSessionTimeoutMs": 4000}
    group = Group(zk_client, zk_root)
    a = broker_factory(0, {TOPIC: 1}, async_system(), name="A", zookeeper=zookeeper)
    b = broker_factory(0, {TOPIC: 1}, async_system(), {"slaveId": 1}, name="B", zookeeper=zookeeper)
    c = broker_factory(0, {TOPIC: 1}, async_system(), {"slaveId": 2}, name="C", zookeeper=zookeeper)
    wait_follows(b, a, group)
    wait_follows(c, a, group)
    epoch_before = group.epoch()
    stream = PutStream(a.address, tag="a").start()
    stream.wait_acked(100)
    stream.stop()
    c.pause()  # SIGSTOP: its session lives on for 4 s, it posts nothing
    try:
        a.kill()
        wait_until(lambda: group.master() == b.url, 20, interval=0.05, message="B to lead")
        wait_leads(b, group, epoch_before)
        assert _fast_takeovers(b) == 1, "B waited for A's session to expire"
        assert "waiting for live slaves [2] to post their log ends" in b.log_text()
    finally:
        c.resume()
    wait_follows(c, b, group)
    first_ack_after(b, b"after-silent-slave")
