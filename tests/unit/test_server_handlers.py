"""The broker's request handlers, in-process: a Broker with zk.zkEnable=false on a real
loopback socket, driven by the client's BrokerConnection."""

from __future__ import annotations

import asyncio
import errno
import logging
import contextlib
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from metaq import record
from metaq.client.connection import BrokerConnection
from metaq.config import parse_server_ini
from metaq.protocol.replies import ReplyError, fetch_stats
from metaq.server.broker import Broker

SERVER_INI = """\
[system]
brokerId=7
hostName=127.0.0.1
serverPort=0
dataPath={data}
unflushThreshold=0
unflushInterval=1000

[zookeeper]
zk.zkEnable=false

[topic=gc]
numPartitions=3

[topic=lazy]
numPartitions=1
unflushThreshold=100000
unflushInterval=600000

[topic=moved]
numPartitions=1
"""


def make_broker(tmp_path: Path) -> Broker:
    path = tmp_path / "server.ini"
    if not path.exists():
        path.write_text(SERVER_INI.format(data=tmp_path / "data"))
    return Broker(parse_server_ini(path.read_bytes(), str(path)))


@contextlib.asynccontextmanager
async def running(tmp_path: Path, before_start=None) -> AsyncIterator[tuple[Broker, BrokerConnection]]:
    broker = make_broker(tmp_path)
    if before_start is not None:
        before_start(broker)
    await broker.start()
    conn = await BrokerConnection.open("127.0.0.1", broker.port)
    try:
        yield broker, conn
    finally:
        conn.close()
        await broker.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class RegisteredSlaves:
    """Stands in for the ZooKeeper registry of a broker started without ZooKeeper: which slaves it names."""

    def __init__(self, *slave_ids: int) -> None:
        self.slave_ids = frozenset(slave_ids)

    async def stop(self, sync_time_ms: int | None = None) -> None:
        pass


def put_header(topic: str, partition: int = 0) -> dict[str, Any]:
    return {"op": "put", "topic": topic, "partition": partition}


async def fetch_all(conn: BrokerConnection, topic: str, partition: int, offset: int = 0) -> list[record.Record]:
    out: list[record.Record] = []
    while True:
        reply = await conn.request({"op": "get", "topic": topic, "partition": partition, "offset": offset})
        if reply.code != 200:
            return out
        records = list(record.iter_records(reply.body, offset))
        out.extend(records)
        offset = records[-1].offset + records[-1].size


# --- put ---------------------------------------------------------------------------------


def test_pipelined_puts_land_in_send_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (_, conn):
            # All written before any reply is read: one connection, many requests in flight.
            futures = [conn.send(put_header("gc", 1), record.encode_record(f"p{i:04d}".encode())) for i in range(300)]
            replies = await asyncio.gather(*futures)
            assert all(r.code == 200 for r in replies)
            offsets = [r["offset"] for r in replies]
            ids = [r["msg_id"] for r in replies]
            assert offsets == sorted(offsets) and len(set(offsets)) == 300
            assert ids == sorted(ids) and len(set(ids)) == 300
            assert [r["end_offset"] for r in replies[:-1]] == offsets[1:], "back to back, no gaps"
            stored = await fetch_all(conn, "gc", 1)
            assert [r.data for r in stored] == [f"p{i:04d}".encode() for i in range(300)]
            assert [(r.offset, r.msg_id) for r in stored] == list(zip(offsets, ids))

    run(scenario())


def test_batch_put_gets_consecutive_ids_and_offsets(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (_, conn):
            batch = record.encode_batch([(f"b{i}".encode(), "attr" if i % 2 else None) for i in range(10)])
            reply = await conn.request({**put_header("gc", 0), "count": 10}, batch)
            assert reply.code == 200 and reply["count"] == 10 and reply["end_offset"] == reply["offset"] + len(batch)
            stored = await fetch_all(conn, "gc", 0)
            assert [r.msg_id for r in stored] == [reply["msg_id"] + i for i in range(10)]
            assert [r.attribute for r in stored] == [None, "attr"] * 5

    run(scenario())


def test_partition_minus_one_is_round_robin(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (_, conn):
            replies = [await conn.request(put_header("gc", -1), record.encode_record(b"rr")) for _ in range(9)]
            partitions = [r["partition"] for r in replies]
            assert sorted(partitions) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
            assert partitions[:3] == partitions[3:6] == partitions[6:], partitions
            assert [len(await fetch_all(conn, "gc", p)) for p in range(3)] == [3, 3, 3]

    run(scenario())


# --- get: long-poll, 301, committed offset ---------------------------------------------------


def test_long_poll_get_wakes_on_a_group_commit(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (_, conn):
            started = time.monotonic()
            get = conn.send({"op": "get", "topic": "gc", "partition": 2, "offset": 0, "max_wait_ms": 10_000})
            await asyncio.sleep(0.3)
            assert not get.done(), "nothing to read yet: the get must be parked"
            put = await conn.request(put_header("gc", 2), record.encode_record(b"wake up"))
            assert put.code == 200
            reply = await asyncio.wait_for(get, 5)
            waited = time.monotonic() - started
            assert reply.code == 200, reply.header
            assert next(record.iter_records(reply.body, 0)).data == b"wake up"
            assert waited < 3, f"the get should wake on the commit, not time out ({waited:.1f}s)"

    run(scenario())


def test_long_poll_get_times_out_with_404(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (_, conn):
            started = time.monotonic()
            reply = await conn.request({"op": "get", "topic": "gc", "partition": 0, "offset": 0, "max_wait_ms": 300})
            waited = time.monotonic() - started
            assert reply.code == 404 and reply["log_end"] == 0 and reply["committed"] == 0
            assert 0.25 <= waited < 2, waited
            # Past the end: 404 that says so.
            reply = await conn.request({"op": "get", "topic": "gc", "partition": 0, "offset": 999})
            assert reply.code == 404 and "beyond the log end" in reply.message

    run(scenario())


def test_offset_below_the_log_start_is_a_301_with_the_log_start(tmp_path: Path) -> None:
    def seed(broker: Broker) -> None:
        broker.store.get_or_create_log("moved", 0, start_offset=4096)

    async def scenario() -> None:
        async with running(tmp_path, before_start=seed) as (_, conn):
            reply = await conn.request({"op": "get", "topic": "moved", "partition": 0, "offset": 100})
            assert reply.code == 301 and reply["offset"] == 4096, reply.header
            put = await conn.request(put_header("moved"), record.encode_record(b"first"))
            assert put["offset"] == 4096
            reply = await conn.request({"op": "get", "topic": "moved", "partition": 0, "offset": 4096})
            assert reply.code == 200 and next(record.iter_records(reply.body, 4096)).data == b"first"
            offset = await conn.request({"op": "offset", "topic": "moved", "partition": 0, "offset": 0})
            assert offset.code == 200 and offset["min_offset"] == 4096 and offset["offset"] == 4096

    run(scenario())


def test_consumers_see_only_flushed_bytes_in_interval_mode_but_replicas_see_the_log_end(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            broker.registry = RegisteredSlaves(0)
            put = await conn.request(put_header("lazy"), record.encode_record(b"not yet flushed"))
            assert put.code == 200, "interval mode acks at once"
            get = {"op": "get", "topic": "lazy", "partition": 0, "offset": 0}
            reply = await conn.request(get)
            assert reply.code == 404, "a consumer must not read past the committed (flushed) offset"
            assert reply["committed"] == 0 and reply["log_end"] == put["end_offset"]
            replica = await conn.request({**get, "replica": {"slave_id": 0, "epoch": 0, "log_end": 0}})
            assert replica.code == 200 and replica["log_end"] == put["end_offset"]
            assert next(record.iter_records(replica.body, 0)).data == b"not yet flushed"

            # A parked consumer get is woken by the flush.
            parked = conn.send({**get, "max_wait_ms": 10_000})
            await asyncio.sleep(0.1)
            assert not parked.done()
            await broker.store.flusher("lazy", 0).flush_now()
            reply = await asyncio.wait_for(parked, 5)
            assert reply.code == 200 and reply["committed"] == put["end_offset"]

    run(scenario())


def test_a_parked_replica_fetch_is_answered_inside_the_put_read_after_its_ack(tmp_path: Path, monkeypatch) -> None:
    """The slave's reply takes no loop turn: it is written while the master still handles the
    read that carried the put, but after that read's ack, which does not wait for the slave
    here (async: old, the slave's reply was built and sent first and the ack waited behind
    it and the slave's wake-up). A fetch parked on the producer's own connection is answered
    too, behind the ack (connection.py ``_process_batch``; docs/sync-replication.md)."""
    from metaq.server import connection as server_connection

    written: list[str] = []  # who each write to a socket went to, in order
    real_write = server_connection.ClientConnection._write

    def recording_write(self: Any, data: bytes) -> None:
        if self._out is None:  # to the socket now, not gathered for the end of the read
            written.append("slave" if b"replicate me" in data else "producer")
        real_write(self, data)

    monkeypatch.setattr(server_connection.ClientConnection, "_write", recording_write)

    def replica_fetch(offset: int) -> dict[str, Any]:
        return {"op": "get", "topic": "lazy", "partition": 0, "offset": offset, "max_size": 1 << 20,
                "max_wait_ms": 10_000, "replica": {"slave_id": 0, "epoch": 0, "log_end": offset}}

    async def put_and_check(conn: BrokerConnection, parked: "asyncio.Future[Any]", data: bytes) -> None:
        await asyncio.sleep(0.1)
        assert not parked.done(), "nothing to replicate yet: the fetch must be parked"
        written.clear()
        put = await conn.request(put_header("lazy"), record.encode_record(data))
        assert put.code == 200
        reply = await asyncio.wait_for(parked, 5)
        assert reply.code == 200 and next(record.iter_records(reply.body, put.header["offset"])).data == data
        assert written == ["producer", "slave"], (
            f"the ack must be written before the slave's reply, in the same read; writes were {written}")

    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            broker.registry = RegisteredSlaves(0)
            slave = await BrokerConnection.open("127.0.0.1", broker.port)
            try:
                await put_and_check(conn, slave.send(replica_fetch(0)), b"replicate me")
                end = broker.store.get_log("lazy", 0).log_end
                # Parked on the producer's own connection: its reply follows the ack on that socket.
                await put_and_check(conn, conn.send(replica_fetch(end)), b"replicate me too")
            finally:
                slave.close()

    run(scenario())


def test_a_parked_fetch_leaves_no_reference_cycle_once_answered_expired_or_abandoned(tmp_path: Path) -> None:
    """A sync master parks one replica fetch per put: each used to be a reference cycle (the
    Deferred, its release, the watch and the timer, closures over each other) that only the
    cyclic collector freed, a collection every ~20 puts and now and then a full one of tens
    of ms in the middle of a put. Answered by a put, by its timer, or dropped with its
    connection, a parked fetch must now be freed by reference counting alone."""
    import gc

    from metaq.deferred import Deferred
    from metaq.server.handlers import ParkedFetch

    def replica_fetch(offset: int, wait_ms: int) -> dict[str, Any]:
        return {"op": "get", "topic": "lazy", "partition": 0, "offset": offset, "max_size": 1 << 20,
                "max_wait_ms": wait_ms, "replica": {"slave_id": 0, "epoch": 0, "log_end": offset}}

    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            broker.registry = RegisteredSlaves(0)
            slave = await BrokerConnection.open("127.0.0.1", broker.port)
            log = broker.store.get_log("lazy", 0)
            for n in range(20):  # answered by a put
                parked = slave.send(replica_fetch(log.log_end, 10_000))
                await asyncio.sleep(0.005)  # parked before the put arrives
                assert (await conn.request(put_header("lazy"), record.encode_record(b"m%d" % n))).code == 200
                assert (await asyncio.wait_for(parked, 5)).code == 200
            for _ in range(5):  # answered by its timer
                assert (await slave.request(replica_fetch(log.log_end, 20), timeout=5)).code == 404
            abandoned = await BrokerConnection.open("127.0.0.1", broker.port)
            abandoned.send(replica_fetch(log.log_end, 10_000))
            await asyncio.sleep(0.05)
            abandoned.close()  # dropped with its connection
            await asyncio.sleep(0.1)
            slave.close()

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # whatever the collector frees from here on is kept for a look
    try:
        run(scenario())
        gc.collect()
        cyclic = [type(o).__name__ for o in gc.garbage if isinstance(o, (Deferred, ParkedFetch))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic == [], f"parked fetches left for the cyclic collector: {len(cyclic)} ({sorted(set(cyclic))})"


def test_position_reports_a_slaves_log_end_and_refuses_bad_reports(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            broker.registry = RegisteredSlaves(4)
            put = await conn.request(put_header("gc"), record.encode_batch([(b"x" * 10, None)] * 3))
            end = put["end_offset"]
            position = {"op": "position", "topic": "gc", "partition": 0}
            reply = await conn.request({**position, "replica": {"slave_id": 4, "epoch": 0, "log_end": end}})
            assert reply.code == 200 and reply["log_end"] == end and reply["epoch"] == 0
            assert broker.ha.progress.position(4, "gc", 0) == end
            bad = [
                ({**position}, 400, "replica"),
                ({**position, "replica": {"slave_id": 4, "epoch": 0}}, 400, "log_end"),
                ({**position, "replica": {"slave_id": 4, "epoch": 0, "log_end": "x"}}, 400, "log_end"),
                ({**position, "replica": {"slave_id": 4, "epoch": 0, "log_end": -1}}, 400, "log_end"),
                ({**position, "replica": {"slave_id": 4, "log_end": 0}}, 400, "epoch"),
                ({**position, "replica": {"slave_id": 4, "epoch": 9, "log_end": 0}}, 403, "epoch"),
                ({**position, "replica": {"slave_id": 99, "epoch": 0, "log_end": 0}}, 403, "not registered"),
                ({**position, "replica": {"slave_id": "4", "epoch": 0, "log_end": 0}}, 400, "slave_id"),
                ({**position, "topic": "nope", "replica": {"slave_id": 4, "epoch": 0, "log_end": 0}}, 404, "nope"),
            ]
            for header, code, word in bad:
                reply = await conn.request(header)
                assert reply.code == code and word in reply.message, (header, reply.code, reply.message)
            assert broker.ha.progress.position(4, "gc", 0) == end, "a refused report changes nothing"

    run(scenario())


def test_a_slave_position_past_our_log_end_is_never_recorded_so_never_counts_later(tmp_path: Path) -> None:
    """A slave that reports more than our log (a divergent tail, a re-created topic's old log):
    recorded, the claim would count once our log grew past it and release sync acks for
    messages the slave never had."""
    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            broker.registry = RegisteredSlaves(4)
            position = {"op": "position", "topic": "gc", "partition": 0}
            fetch = {"op": "get", "topic": "gc", "partition": 0, "max_size": 4096, "max_wait_ms": 0}
            reply = await conn.request({**position, "replica": {"slave_id": 4, "epoch": 0, "log_end": 80}})
            assert reply.code == 400 and "past the master's log end 0" in reply.message  # refused (and logged)
            reply = await conn.request({**fetch, "offset": 80, "replica": {"slave_id": 4, "epoch": 0, "log_end": 80}})
            assert reply["log_end"] == 0  # what lets the slave see that its log is not ours
            assert broker.ha.progress.position(4, "gc", 0) is None
            await conn.request(put_header("gc"), record.encode_batch([(b"x" * 60, None)] * 2))
            assert broker.store.get_log("gc", 0).log_end > 80
            assert broker.ha.progress.position(4, "gc", 0) is None, "a claim past our end counted once we grew"
            reply = await conn.request({**position, "replica": {"slave_id": 4, "epoch": 0, "log_end": 0}})
            assert broker.ha.progress.position(4, "gc", 0) == 0  # a position inside our log is recorded

    run(scenario())


# --- stats --------------------------------------------------------------------------------------


def parse_stats(body: bytes) -> dict[str, str]:
    lines = body.decode().split("\r\n")
    assert lines[0] == "STATS" and lines[-2:] == ["END", ""], lines
    return dict(line.split(" ", 1) for line in lines[1:-2])


def test_stats_items(tmp_path: Path) -> None:
    async def stats(conn: BrokerConnection, item: str = "") -> bytes:
        reply = await conn.request({"op": "stats", "item": item})
        assert reply.code == 200
        return bytes(reply.body)

    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            for _ in range(3):
                await conn.request(put_header("gc", 0), record.encode_batch([(b"x" * 10, None)] * 2))
            await conn.request({"op": "get", "topic": "gc", "partition": 0, "offset": 0})

            general = parse_stats(await stats(conn))
            assert general["broker_id"] == "7" and general["role"] == "master"
            assert general["put_messages"] == "6" and general["get_requests"] == "1"
            assert general["topics"] == "3"

            topics = parse_stats(await stats(conn, "topics"))
            assert topics["gc"].startswith("put_messages=6 put_bytes=180 get_requests=1")

            offsets = parse_stats(await stats(conn, "offsets"))
            assert set(offsets) == {"gc-7-0", "gc-7-1", "gc-7-2", "lazy-7-0", "moved-7-0"}
            assert offsets["gc-7-0"] == "min_offset=0 max_offset=180 committed=180 flushed=180"
            assert parse_stats(await stats(conn, "gc")).keys() == {"gc-7-0", "gc-7-1", "gc-7-2"}

            config = await stats(conn, "config")
            assert config.startswith(broker.config.raw.rstrip(b"\n"))
            assert b"\n; [topic=gc] numPartitions=3 " in config  # the topics served now, as comments
            explained = parse_stats(await stats(conn, "help"))
            assert set(explained) >= {"topics", "offsets", "config", "reset", "help"}
            assert explained["offsets"].startswith("per partition")  # each item says what it shows
            assert parse_stats(await stats(conn, "realtime"))["put_messages"] == "6"

            unknown = await stats(conn, "bogus")
            assert unknown.startswith(b"ERROR unknown stats item 'bogus'")

            parse_stats(await stats(conn, "reset"))
            after = parse_stats(await stats(conn))
            assert after["put_messages"] == "0" and after["get_requests"] == "0"
            assert parse_stats(await stats(conn, "offsets"))["gc-7-0"].startswith("min_offset=0 max_offset=180"), \
                "reset clears counters, never data"

    run(scenario())


def test_stats_as_a_map(tmp_path: Path) -> None:
    """format "map": the same stats as data, read by the one reader (fetch_stats)."""

    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            await conn.request(put_header("gc", 0), record.encode_batch([(b"x" * 10, None)] * 2))
            general = await fetch_stats(conn)
            assert (general.get("broker_id"), general.get("role"), general.get("put_messages")) == (7, "master", 2)
            offsets = await fetch_stats(conn, "offsets")
            assert offsets.row("gc-7-0") == {"min_offset": 0, "max_offset": 60, "committed": 60, "flushed": 60}
            assert (await fetch_stats(conn, "topics")).row("gc")["put_bytes"] == 60
            for item, word in (("bogus", "unknown stats item 'bogus'"), ("config", "server.ini text")):
                with pytest.raises(ReplyError, match=word) as err:
                    await fetch_stats(conn, item)
                assert err.value.code == 400
            text = await conn.request({"op": "stats", "item": "offsets"})
            assert "gc-7-0 min_offset=0 max_offset=60 committed=60 flushed=60" in text.body.decode()

    run(scenario())


# --- msg ids across a restart ------------------------------------------------------------------


def test_msg_ids_stay_unique_and_increasing_across_a_restart(tmp_path: Path) -> None:
    async def put_some(n: int) -> list[int]:
        async with running(tmp_path) as (_, conn):
            ids = []
            for i in range(n):
                reply = await conn.request(put_header("gc", i % 3), record.encode_batch([(b"id", None)] * 3))
                ids.extend(reply["msg_id"] + k for k in range(3))
            return ids

    first = run(put_some(20))
    second = run(put_some(20))
    third = run(put_some(5))
    ids = first + second + third
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert min(second) > max(first) and min(third) > max(second)
    assert all((i >> 12) & 1023 == 7 for i in ids), "the broker id is in every msg id"


@pytest.mark.parametrize("item", ["offsets", ""])
def test_stats_over_a_fresh_broker_create_no_surprises(tmp_path: Path, item: str) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (_, conn):
            reply = await conn.request({"op": "stats", "item": item})
            assert reply.code == 200 and bytes(reply.body).endswith(b"END\r\n")

    run(scenario())


def test_a_failed_append_is_answered_500_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            log = broker.store.get_log("gc", 0)

            def disk_full(_body: bytes) -> int:
                raise OSError(errno.ENOSPC, "No space left on device")

            log.append = disk_full  # type: ignore[method-assign]
            reply = await conn.request(put_header("gc"), record.encode_record(b"x"))
            assert reply.code == 500 and "No space left" in reply.message

    with caplog.at_level(logging.ERROR, logger="metaq.server.handlers"):
        run(scenario())
    assert any("append of 1 messages to gc-0 failed" in r.getMessage() for r in caplog.records)


def test_a_connection_hands_every_request_the_same_context_until_its_principal_changes() -> None:
    """``ClientConnection._context``: one RequestContext per connection (made per request before),
    a new one the moment the principal differs (a login), naming the connection's producer claim."""
    from metaq.security.principals import Principal
    from metaq.server.connection import ClientConnection
    from metaq.server.stats import BrokerStats

    class Handlers:
        stats = BrokerStats()

    conn = ClientConnection(Handlers(), 1024)  # type: ignore[arg-type]
    first = conn._context()
    assert conn._context() is first and first.principal is None and first.peer == conn.peer
    conn.principal = Principal("alice")  # what a login sets (``_authenticate``)
    logged_in = conn._context()
    assert logged_in is not first and logged_in.principal is conn.principal
    assert conn._context() is logged_in and logged_in.verified_producer is first.verified_producer


def test_offset_requests_for_partitions_without_logs_lay_them_out_in_one_batch(tmp_path: Path) -> None:
    """An empty slave asks the master for the oldest offset of each partition of a new topic,
    many at once: the master creates those logs in one batch off the event loop, not one at a
    time on it with an fsync each."""
    batches: list[int] = []

    def count_batches(broker: Broker) -> None:
        real = broker.store._lay_out_and_open
        broker.store._lay_out_and_open = lambda new: batches.append(len(new)) or real(new)  # type: ignore[method-assign]

    async def scenario() -> None:
        async with running(tmp_path, before_start=count_batches) as (broker, conn):
            replies = await asyncio.gather(*(conn.request({"op": "offset", "topic": "gc", "partition": p, "offset": 0})
                                             for p in range(3)))
            assert [(r.code, r["min_offset"], r["max_offset"]) for r in replies] == [(200, 0, 0)] * 3
            assert batches == [3], "the three logs in one batch"
            assert all(broker.store.open_log("gc", p) is not None for p in range(3))
            bad = await conn.request({"op": "offset", "topic": "gc", "partition": 7, "offset": 0})
            assert bad.code == 400 and "partition" in bad.message, bad.header
            again = await conn.request({"op": "offset", "topic": "gc", "partition": 1, "offset": 0})
            assert again.code == 200 and batches == [3], "an open log answers at once"

    run(scenario())
