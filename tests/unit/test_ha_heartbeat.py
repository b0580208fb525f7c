"""UDP heartbeats (metaq/ha/heartbeat.py): message checks, both ends, and a real UDP round trip."""

from __future__ import annotations

import asyncio
import math
import time
from types import SimpleNamespace

import msgpack
import pytest

from metaq.config import SlaveConfig
from metaq.ha.heartbeat import (FULL_REPORT_EVERY_S, BadHeartbeat, HeartbeatResponder, SlaveHeartbeat, decode, encode,
                                encode_signed)
from metaq.ha.node import HaNode
from metaq.ha.progress import ReplicationProgress
from metaq.ha.record import RecordTable
from metaq.ha.role import Role
from metaq.zk.embedded import free_port


class FakeLog:
    def __init__(self, end: int) -> None:
        self.log_end = self.flushed_end = end


LOGS = {("t", 0): FakeLog(500), ("t", 1): FakeLog(70)}


def fake_ha(master: bool = True) -> SimpleNamespace:
    """The HA facade as the responder reads it (metaq.ha.heartbeat.HaView)."""
    ha = SimpleNamespace(
        epoch=2,
        acting_master=master,
        progress=ReplicationProgress(),
        committed=lambda topic, partition, log: log.log_end - 10,
        heard=[],
    )

    def slave_heartbeat(slave_id, address, log_ends, epoch):
        ha.progress.heartbeat(slave_id, address, log_ends, epoch)
        ha.heard.append(slave_id)

    ha.slave_heartbeat = slave_heartbeat
    return ha


def responder_for(ha: object, port: int = 0) -> HeartbeatResponder:
    return HeartbeatResponder(3, ha, lambda: LOGS, "127.0.0.1", port)


def slave_message(**overrides: object) -> bytes:
    message = {"kind": "hb", "role": "slave", "broker_id": 3, "slave_id": 1, "epoch": 2,
               "log_ends": {"t/0": 400, "t/1": 70}, "sent_at": time.time(), "pad": bytes(64)}
    message.update(overrides)
    return encode(message)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1\xc1",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"kind": "nope"}),
        slave_message(role="master"),
        slave_message(broker_id="3"),
        slave_message(slave_id=-1),
        slave_message(epoch=True),
        slave_message(sent_at="now"),
        slave_message(log_ends=[1]),
        slave_message(log_ends={"t0": 1}),
        slave_message(log_ends={"t/0": -5}),
        slave_message(log_ends={7: 1}),
        b"\x00" * 70_000,
    ],
)
def test_malformed_datagrams_are_rejected(data):
    with pytest.raises(BadHeartbeat):
        decode(data, "slave")


def test_responder_records_progress_and_answers():
    broker = fake_ha()
    responder = responder_for(broker)
    answer = responder.handle(slave_message(), ("127.0.0.1", 5555))
    assert responder.received == 1 and responder.bad == 0
    assert broker.progress.position(1, "t", 0) == 400
    assert broker.heard == [1]
    assert 0 <= broker.progress.heartbeat_ages_ms()[1] < 1000
    reply = decode(answer, "master")
    assert reply["_log_ends"] == {("t", 0): 500, ("t", 1): 70}
    assert reply["_committed"] == {("t", 0): 490, ("t", 1): 60}
    assert reply["epoch"] == 2 and reply["broker_id"] == 3
    lag = {(row.topic, row.partition): row.bytes for row in broker.progress.lag({("t", 0): 500, ("t", 1): 70})}
    assert lag == {("t", 0): 100, ("t", 1): 0}


def test_responder_ignores_bad_and_foreign_heartbeats():
    broker = fake_ha()
    responder = responder_for(broker)
    assert responder.handle(b"junk", ("127.0.0.1", 1)) is None
    assert responder.handle(slave_message(broker_id=4), ("127.0.0.1", 1)) is None
    assert responder.bad == 2 and responder.received == 0
    assert broker.progress.slaves == {}


def test_slave_side_keeps_the_masters_last_answer():
    now = [100.0]
    hb = SlaveHeartbeat(3, 1, lambda: 2, lambda: {("t", 0): 400}, clock=lambda: now[0])
    assert hb.master_silent_for() is None  # no master
    hb.target = ("127.0.0.1", 1)
    hb._since = 100.0
    now[0] = 101.5
    assert hb.master_silent_for() == pytest.approx(1.5)
    answer = responder_for(fake_ha()).handle(decode_roundtrip(hb.message()), ("x", 1))
    hb.handle(answer)
    assert hb.master is not None and hb.master.log_ends[("t", 0)] == 500
    assert hb.master.rtt_ms is not None and hb.master.rtt_ms >= 0
    assert hb.master_silent_for() == 0.0
    now[0] = 102.0
    assert hb.heartbeat_age_ms() == pytest.approx(500)
    hb.handle(b"garbage")
    hb.handle(slave_message())  # a slave's message is not a master's answer
    assert hb.bad == 2 and hb.received == 1


def decode_roundtrip(data: bytes) -> bytes:
    decode(data, "slave")  # the slave's own message is well formed
    return data


def test_udp_round_trip():
    async def go() -> None:
        broker = fake_ha()
        port = free_port("127.0.0.1")
        responder = responder_for(broker, port)
        assert await responder.start()
        hb = SlaveHeartbeat(3, 1, lambda: 2, lambda: {("t", 0): 123}, interval=0.05)
        hb.retarget(("127.0.0.1", port))
        try:
            for _ in range(100):
                if hb.received >= 3:
                    break
                await asyncio.sleep(0.02)
            assert hb.received >= 3 and responder.received >= 3
            assert broker.progress.position(1, "t", 0) == 123
            assert hb.master_silent_for() < 0.5
        finally:
            await hb.stop()
            await responder.stop()

    asyncio.run(go())


def test_unanswered_heartbeats_never_crash():
    async def go() -> None:
        port = free_port("127.0.0.1")  # nobody listens: ICMP port unreachable
        hb = SlaveHeartbeat(3, 1, lambda: 0, lambda: {}, interval=0.02)
        hb.retarget(("127.0.0.1", port))
        await asyncio.sleep(0.3)
        assert hb.running and hb.master is None and hb.sent >= 2
        assert hb.master_silent_for() >= 0.25
        hb.retarget(None)
        assert hb.master_silent_for() is None
        await hb.stop()

    asyncio.run(go())


def test_a_slave_answers_as_a_slave_and_records_nothing():
    ha = fake_ha(master=False)
    reply = msgpack.unpackb(responder_for(ha).handle(slave_message(), ("127.0.0.1", 1)), raw=False)
    assert reply["role"] == "slave"
    assert ha.progress.slaves == {} and ha.heard == []


class PromotedHost:
    """A broker started with ``--slave 0`` (so it prefers to follow) that has since won an election."""

    config = SimpleNamespace(broker_id=3)
    store = SimpleNamespace(logs=lambda: LOGS)
    registry = SimpleNamespace(slave_id=None)
    partitions = RecordTable()


def test_a_promoted_broker_started_with_slave_answers_as_the_master():
    """Regression (HA issue, finding 2): the role came from ``--slave``, not from the election,
    so the promoted broker answered "slave" and its slaves counted every answer as bad."""
    node = HaNode(PromotedHost(), SlaveConfig(slave_id=0, slave_group="g"), in_zookeeper=True)
    node.coordinator = SimpleNamespace(state=Role.LEADING, epochs=SimpleNamespace(serving=5),
                                       leadership=SimpleNamespace(sync_set=None), followership=SimpleNamespace(follower=None))
    responder = responder_for(node)
    slave = SlaveHeartbeat(3, 1, lambda: 5, lambda: {("t", 0): 400})
    slave.handle(responder.handle(slave.message(), ("127.0.0.1", 5555)))
    assert slave.bad == 0 and slave.received == 1, slave.last_bad
    assert slave.master is not None and slave.master.role == "master" and slave.master.epoch == 5
    assert node.role_name == "master" and node.acting_master
    assert node.progress.position(1, "t", 0) == 400, "the promoted master records its slaves' progress"


# --- trust: signed heartbeats, unknown slaves, made-up partitions -----------------------------

KEY = b"k" * 32


def test_with_a_group_key_only_signed_heartbeats_count_and_answers_are_signed() -> None:
    ha = fake_ha()
    responder = HeartbeatResponder(3, ha, lambda: LOGS, "127.0.0.1", 0, key=KEY)
    assert responder.handle(slave_message(), ("127.0.0.1", 9)) is None, "unsigned"
    forged = msgpack.unpackb(slave_message(), raw=False)
    assert responder.handle(encode({**forged, "mac": b"x" * 32}), ("127.0.0.1", 9)) is None, "wrong MAC"
    assert ha.heard == [] and "MAC" in str(responder.last_bad)
    slave = SlaveHeartbeat(3, 1, lambda: 2, lambda: {("t", 0): 400}, key=KEY)
    answer = responder.handle(slave.message(), ("127.0.0.1", 9))
    assert ha.heard == [1] and answer is not None
    slave.handle(answer)
    assert slave.master is not None and slave.bad == 0
    other_group = SlaveHeartbeat(3, 1, lambda: 2, lambda: {}, key=b"o" * 32)
    other_group.handle(answer)
    assert other_group.master is None and other_group.bad == 1


def test_heartbeats_from_unregistered_slaves_or_for_unknown_partitions_leave_no_state() -> None:
    ha = fake_ha()
    responder = HeartbeatResponder(3, ha, lambda: LOGS, "127.0.0.1", 0, known_slave=lambda slave_id: slave_id == 1)
    for slave_id in range(2, 500):
        assert responder.handle(slave_message(slave_id=slave_id), ("127.0.0.1", 9)) is None
    junk = {f"fake{n}/0": n for n in range(2000)}
    responder.handle(slave_message(log_ends={**junk, "t/0": 400}), ("127.0.0.1", 9))
    assert set(ha.progress.slaves) == {1}
    assert set(ha.progress.positions) == {(1, "t", 0)}


def test_a_replayed_or_stale_signed_heartbeat_is_ignored_and_unanswered() -> None:
    ha = fake_ha()
    responder = HeartbeatResponder(3, ha, lambda: LOGS, "127.0.0.1", 0, key=KEY)
    slave = SlaveHeartbeat(3, 1, lambda: 2, lambda: {("t", 0): 400}, key=KEY)
    recorded = slave.message()
    assert responder.handle(recorded, ("127.0.0.1", 9)) is not None
    assert responder.handle(recorded, ("127.0.0.1", 9)) is None and "replayed" in str(responder.last_bad)
    old = msgpack.unpackb(recorded, raw=False)
    del old["mac"]
    for sent_at in (time.time() - 3600, time.time() + 3600):
        assert responder.handle(encode_signed({**old, "sent_at": sent_at}, KEY), ("127.0.0.1", 9)) is None
        assert "outside" in str(responder.last_bad)
    assert ha.heard == [1] and responder.bad == 3
    assert responder.handle(slave.message(), ("127.0.0.1", 9)) is not None, "the next fresh one counts"


def test_answers_go_only_to_the_registered_host_and_never_outgrow_the_heartbeat() -> None:
    ha = fake_ha()
    responder = HeartbeatResponder(3, ha, lambda: LOGS, "127.0.0.1", 0, slave_hosts=lambda slave_id: {"127.0.0.5"})
    assert responder.handle(slave_message(), ("127.0.0.9", 9)) is None and responder.unanswered == 1
    assert ha.heard == [1], "recorded (it is authentic), just not answered elsewhere"
    padded = slave_message()
    answer = responder.handle(padded, ("127.0.0.5", 9))
    assert answer is not None and len(answer) <= len(padded)
    assert decode(answer, "master")["_committed"] == {("t", 0): 490, ("t", 1): 60}, "the pad makes room for it all"
    bare = slave_message(pad=b"")
    smaller = responder.handle(bare, ("127.0.0.5", 9))
    assert smaller is not None and len(smaller) <= len(bare)


def test_a_log_end_of_another_life_of_its_topic_is_not_recorded() -> None:
    # The master re-created topic t; its slave, not yet following the new life, still
    # heartbeats its old t-0 end. Recorded, it would count once the new t-0 grew past it and
    # release acks for messages the slave never had. A log end counts only with the
    # incarnation the master serves.
    ha = fake_ha()
    lives = {"t": "new-life"}
    responder = HeartbeatResponder(3, ha, lambda: LOGS, "127.0.0.1", 0, incarnations=lambda: lives)
    responder.handle(slave_message(incarnations={"t": "old-life"}), ("127.0.0.1", 9))
    assert ha.progress.position(1, "t", 0) is None and ha.heard == [1]
    responder.handle(slave_message(incarnations={"t": "new-life"}), ("127.0.0.1", 9))
    assert ha.progress.position(1, "t", 0) == 400


def test_a_slave_heartbeat_names_the_life_of_each_topic_it_reports() -> None:
    slave = SlaveHeartbeat(3, 1, lambda: 2, lambda: {("t", 0): 400}, incarnations=lambda: {"t": "life-2", "u": "other"})
    message = decode(slave.message(), "slave")
    assert message["_log_ends"] == {("t", 0): 400} and message["incarnations"] == {"t": "life-2"}
    with pytest.raises(BadHeartbeat, match="incarnations"):
        decode(slave_message(incarnations={"t": 7}), "slave")


# --- many partitions: every log end reaches the master, in datagrams that fit ----------------

WIDE = 10_000


class WideLog:
    def __init__(self, end: int) -> None:
        self.log_end = end


def wide_ends(base: int = 1_000_000) -> dict[tuple[str, int], int]:
    return {(f"scale-topic-{n // 100}", n % 100): base + n for n in range(WIDE)}


def test_a_beat_of_10000_partitions_is_split_into_datagrams_that_each_fit() -> None:
    ends = wide_ends()
    lives = {f"scale-topic-{n}": f"life-{n}" for n in range(WIDE // 100)}
    slave = SlaveHeartbeat(3, 1, lambda: 2, lambda: ends, key=KEY, incarnations=lambda: lives)
    datagrams = slave.messages()
    assert len(datagrams) > 1 and all(len(d) <= 60 * 1024 for d in datagrams)
    seen: dict[tuple[str, int], int] = {}
    for datagram in datagrams:
        message = decode(datagram, "slave", KEY)
        seen.update(message["_log_ends"])
        assert set(message["incarnations"]) == {topic for topic, _p in message["_log_ends"]}
    assert seen == ends, "the first beat names every partition, nothing cut off"


def test_an_idle_slave_sends_moved_log_ends_at_once_and_every_one_within_the_full_report_time() -> None:
    ends = wide_ends()
    slave = SlaveHeartbeat(3, 1, lambda: 2, lambda: ends, interval=0.5)

    def beat() -> dict[tuple[str, int], int]:
        named: dict[tuple[str, int], int] = {}
        for datagram in slave.messages():
            named.update(decode(datagram, "slave")["_log_ends"])
        return named

    assert len(beat()) == WIDE
    ends[("scale-topic-99", 99)] += 7
    second = beat()
    assert second[("scale-topic-99", 99)] == ends[("scale-topic-99", 99)], "a moved log end goes with the next beat"
    share = math.ceil(WIDE * 0.5 / FULL_REPORT_EVERY_S)
    assert len(second) <= share + 1, "an idle beat names a slice of the rotation, not every partition"
    again: set[tuple[str, int]] = set(second)
    for _ in range(math.ceil(FULL_REPORT_EVERY_S / 0.5) - 1):  # the full-report time, in beats
        again |= set(beat())
    assert again == set(ends), "every log end is sent again within the full-report time"


class CountingPositions:
    """A follower's ``ReplicaPositions``: which partitions a beat looks at, counted."""

    def __init__(self, ends: dict[tuple[str, int], int]) -> None:
        self.ends = ends
        self.appended: set[tuple[str, int]] = set()
        self.looked_at: list[tuple[str, int]] = []

    def keys(self) -> list[tuple[str, int]]:
        return list(self.ends)

    def moved(self) -> set[tuple[str, int]]:
        moved, self.appended = self.appended, set()
        return moved

    def report(self, key: tuple[str, int]) -> tuple[int, str] | None:
        self.looked_at.append(key)
        end = self.ends.get(key)
        return None if end is None else (end, f"life-{key[0]}")


def test_an_idle_beat_looks_at_the_moved_partitions_and_its_slice_only() -> None:
    ends = wide_ends()
    positions = CountingPositions(ends)
    slave = SlaveHeartbeat(3, 1, lambda: 2, interval=0.5, positions=positions)

    def beat() -> dict[tuple[str, int], int]:
        positions.looked_at.clear()
        named: dict[tuple[str, int], int] = {}
        for datagram in slave.messages():
            message = decode(datagram, "slave")
            named.update(message["_log_ends"])
            assert message["incarnations"] == {t: f"life-{t}" for t, _p in message["_log_ends"]}
        return named

    assert len(beat()) == WIDE, "the first beat to a master names every partition"
    share = math.ceil(WIDE * 0.5 / FULL_REPORT_EVERY_S)
    moved = ("scale-topic-7", 3)
    ends[moved] += 11
    positions.appended.add(moved)
    second = beat()
    assert second[moved] == ends[moved], "an appended partition goes with the next beat"
    assert len(positions.looked_at) <= share + 1, "a beat does not look at every partition"
    positions.appended.add(moved)  # told again, not moved: not sent again unless in the slice
    assert moved not in beat() or moved in positions.looked_at[-share:]
    del ends[("scale-topic-0", 0)]  # its replica went: skipped, never an error
    again: set[tuple[str, int]] = set()
    for _ in range(math.ceil(FULL_REPORT_EVERY_S / 0.5)):
        again |= set(beat())
    assert again == set(ends), "every log end is sent again within the full-report time"
    slave.target = ("127.0.0.1", 1)
    slave.retarget(None)  # the master changed (here: to none)
    assert len(beat()) == len(ends), "after a change of master the next beat names them all"


def test_10000_partitions_positions_reach_the_master_over_udp_signed() -> None:
    async def go() -> None:
        ends = wide_ends()
        logs = {key: WideLog(end) for key, end in ends.items()}
        broker = fake_ha()
        port = free_port("127.0.0.1")
        responder = HeartbeatResponder(3, broker, lambda: logs, "127.0.0.1", port, key=KEY)
        assert await responder.start()
        slave = SlaveHeartbeat(3, 1, lambda: 2, lambda: ends, interval=0.05, key=KEY)
        slave.retarget(("127.0.0.1", port))
        try:
            for _ in range(400):
                if len(broker.progress.positions) == WIDE and slave.master and len(slave.master.log_ends) == WIDE:
                    break
                await asyncio.sleep(0.05)
            recorded = {(topic, partition): pos.log_end for (_slave, topic, partition), pos in broker.progress.positions.items()}
            assert recorded == ends, f"{len(recorded)} of {WIDE} positions reached the master"
            assert responder.bad == 0, responder.last_bad
            assert slave.master is not None and slave.master.log_ends == ends, "the answers are merged, not replaced"
        finally:
            await slave.stop()
            await responder.stop()

    asyncio.run(go())
