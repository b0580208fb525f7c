"""A partition first opened while the broker runs (a topic's server.ini section removed, its
files kept, then added back): its transaction state loads in a worker thread, numbered puts
get a retriable 503 meanwhile, and once loaded a retry of a batch from before is a duplicate.
In-process: a Broker with zk.zkEnable=false on a real loopback socket (test_server_handlers.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Callable

import pytest

from metaq import record
from metaq.protocol.messages import PutRequest
from tests.unit.test_partitions import HeldLoads
from tests.unit.test_server_handlers import run, running


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"waited {timeout_s} s for {what}"
        await asyncio.sleep(0.005)


def test_a_topic_added_back_at_run_time_loads_its_producers_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payloads = [b"idem-0", b"idem-1", b"idem-2"]
    body = b"".join(record.encode_record(p) for p in payloads)
    header = PutRequest(topic="gc", partition=0, count=len(payloads), producer_id=4242, producer_epoch=0,
                        sequence=0).to_header()

    async def scenario() -> None:
        async with running(tmp_path) as (broker, conn):
            first = await conn.request(header, body)
            assert first.code == 200 and not first.get("duplicate"), first.header
            served = broker.config.topics
            # The section removed (no group configuration: its files stay), then added back.
            await broker.update_topics({name: topic for name, topic in served.items() if name != "gc"})
            held = HeldLoads(monkeypatch)
            await broker.update_topics(served)  # opens gc-0 at once: its files hold a batch
            await until(lambda: bool(held.threads), "the load to start")
            assert threading.get_ident() not in held.threads  # not on the event loop's thread
            loading = await conn.request(header, body)  # the event loop still answers, and nothing is stored
            assert loading.code == 503 and "still being loaded" in loading.message, loading.header
            held.release.set()
            await until(lambda: broker.partitions.get("gc", 0).ready, "the load to finish")
            retry = await conn.request(header, body)
            assert retry.code == 200 and retry.get("duplicate") and retry["offset"] == first["offset"], retry.header

    run(scenario())
