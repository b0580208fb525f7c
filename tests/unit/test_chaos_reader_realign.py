"""The chaos workload's raw readers (``reader-g*``, ``committed-reader-g*``) after an async
failover took back records they had read: their position on a replica may fall inside a record
of the log it serves now. They realign as the client consumer does (``offset`` with
``realign``), and only damaged bytes at a position the replica vouches for end the task (campaign
seed 8114: both readers of group 1 crashed with 'record at offset 289: checksum mismatch')."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from chaos.history import History
from chaos.runner import Workload
from metaq.client.connection import Reply
from metaq.protocol import commands as c
from metaq.record import RecordError, encode_record

TOPIC = "chaos"
URL = "meta://old-master"


def log_of(*values: str) -> bytes:
    return b"".join(encode_record(v.encode()) for v in values)


class Replica:
    """One replica's partition chaos/1-0 as the reader's connection sees it: ``get`` serves the
    log's bytes from the asked offset (no record-start check, as a broker does); ``offset`` with
    ``realign`` answers ``realign_to`` (None: the asked offset, a record starts there)."""

    def __init__(self, log: bytes) -> None:
        self.log = log
        self.realign_to: int | None = None
        self.realigns: list[int] = []
        self.is_open = True
        self.workload: Workload | None = None

    async def request(self, header: dict[str, Any], body: bytes = b"", timeout: float | None = None) -> Reply:
        at = header["offset"]
        if header["op"] == "offset":
            assert header["realign"] is True
            self.realigns.append(at)
            answer = at if self.realign_to is None else self.realign_to
            return Reply({"code": c.OK, "offset": answer, "realign": "epoch_start", "epoch": 3}, bytearray())
        assert header["op"] == "get" and header["topic"] == TOPIC and header["partition"] == 0
        if self.workload is not None and at >= len(self.log):
            self.workload.stopping.set()  # read all there is: end the reader's loop
        return Reply({"code": c.OK, "offset": at}, bytearray(self.log[at:]))

    def close(self) -> None:
        self.is_open = False


def run_reader(replica: Replica, rounds_before_failover: int = 1, new_log: bytes | None = None) -> History:
    """The raw reader of group 1 against one replica: it reads the whole old log, the replica's
    log becomes ``new_log`` (an async failover took back its tail and the new master wrote other
    records there), and it reads on until it has read the new log's end."""
    history = History()
    connects = 0

    async def connect(url: str, timeout: float) -> Replica:
        nonlocal connects
        connects += 1
        if connects > rounds_before_failover and new_log is not None:
            replica.log = new_log
            replica.workload = workload
        return replica

    cluster = SimpleNamespace(topic=TOPIC, txn_topic="txn-b", partitions=1, topics={TOPIC: 1}, connect=connect)
    monitor = SimpleNamespace(replicas={1: [URL]})
    workload = Workload(cluster, history, monitor, seed=1, rate=1.0)  # type: ignore[arg-type]

    async def main() -> None:
        reader = asyncio.create_task(workload.reader(1))
        await asyncio.sleep(0.05)  # the first round: the old log
        replica.is_open = False  # the next round connects again, to the new log
        await asyncio.wait_for(reader, timeout=10)

    asyncio.run(main())
    return history


def reads(history: History) -> list[tuple[int, str]]:
    return [tuple(pair) for op in history.ops if op.get("f") == "get" and op["type"] == "ok"
            for pair in op["reads"]]


def test_a_reader_whose_position_falls_inside_a_record_of_the_new_log_resumes_at_the_epoch_start(caplog):
    old = log_of("r0-1", "r0-2-taken-back")
    epoch_start = len(encode_record(b"r0-1"))
    # The new master's records at the taken-back offsets: the reader's position (the old log's
    # end) falls inside the second one.
    new = log_of("r0-1", "n1", "n2-longer-than-the-old-tail", "n3")
    assert len(old) < len(new)
    replica = Replica(old)
    replica.realign_to = epoch_start
    with caplog.at_level(logging.WARNING, logger="chaos.runner"):
        history = run_reader(replica, new_log=new)
    assert replica.realigns == [len(old)]
    assert reads(history) == [(0, "r0-1"), (epoch_start, "r0-2-taken-back"),
                              (epoch_start, "n1"), (epoch_start + len(encode_record(b"n1")), "n2-longer-than-the-old-tail"),
                              (len(new) - len(encode_record(b"n3")), "n3")]
    warning = [r.getMessage() for r in caplog.records if "no record starts at" in r.getMessage()]
    assert warning == [f"reader-g1: chaos/1-0 on {URL}: no record starts at {len(old)} (the log changed under this "
                       f"position, e.g. an async failover took back records); resuming at {epoch_start} (epoch_start 3)"]


def test_damaged_bytes_at_a_position_the_replica_vouches_for_still_end_the_reader():
    good = log_of("r0-1")
    damaged = bytearray(log_of("r0-2"))
    damaged[-1] ^= 0xFF  # its CRC fails: not a position problem, the replica's bytes are bad
    replica = Replica(good)
    replica.realign_to = None  # "a record starts there"
    with pytest.raises(RecordError, match="though the replica says one does"):
        run_reader(replica, new_log=good + bytes(damaged))
    assert replica.realigns == [len(good)]
