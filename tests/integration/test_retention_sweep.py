"""docs/storage.md, "Retention", against a real broker process: every topic's deleteWhen runs
from one task of the broker (tests/unit/test_store_retention.py has the one-pass check); each
topic's old closed segments go, the active one stays, and the partition takes puts after."""

from __future__ import annotations

import asyncio
import os

from metaq.client.connection import BrokerConnection
from metaq.record import encode_batch
from metaq.store.segment import SEGMENT_SUFFIX
from metaq.tools.launcher import wait_until

TOPICS = ("alpha", "beta", "gamma")


async def _fill(address: tuple[str, int]) -> None:
    """Enough 200-byte messages to each topic for several 1 KiB segments."""
    conn = await BrokerConnection.open(*address)
    try:
        for n in range(24):
            replies = await asyncio.gather(*(conn.send({"op": "put", "topic": topic, "partition": 0},
                                                       encode_batch([(f"{topic}-{n}".encode().ljust(200, b"."), None)]))
                                             for topic in TOPICS))
            assert all(reply.ok for reply in replies), [reply.header for reply in replies]
    finally:
        conn.close()


def test_topics_due_together_lose_their_old_segments_in_one_pass(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(0, {topic: 1 for topic in TOPICS},
                            {"deleteWhen": "*/2 * * * * ?", "deletePolicy": "delete,1s", "maxSegmentSize": 1024,
                             "unflushThreshold": 0})
    asyncio.run(_fill(broker.address))
    directories = {topic: broker.dir / "data" / f"{topic}-0" for topic in TOPICS}

    def segments(topic: str) -> list[str]:
        return sorted(name for name in os.listdir(directories[topic]) if name.endswith(SEGMENT_SUFFIX))

    assert all(len(segments(topic)) >= 3 for topic in TOPICS), {topic: segments(topic) for topic in TOPICS}
    # Closed segments older than 1 s go at a pass (each 2 s), their files after the 10 s grace.
    wait_until(lambda: all(len(segments(topic)) == 1 for topic in TOPICS), 60,
               message="every topic's old segments removed")
    # The pass says what it removed once the files are gone (a moment after): wait for its lines.
    def logged_passes() -> list[str] | None:
        passes = [line for line in broker.log_text().splitlines() if "retention (delete) removed" in line]
        return passes if all(any(f"topic {topic}:" in line for line in passes) for topic in TOPICS) else None

    wait_until(logged_passes, 10, message="a retention line for every topic")
    assert "Traceback" not in broker.log_text()
    # The log reads on from its new start, and takes puts.
    asyncio.run(_fill(broker.address))
