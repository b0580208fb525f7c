"""What more than one benchmark does the same way."""

from __future__ import annotations

from metaq.client.connection import BrokerConnection
from metaq.protocol.messages import GetRequest
from metaq.record import iter_records, record_ends


async def fetch_sequentially(
    conn: BrokerConnection, topic: str, expected: int, decode: bool, max_size: int = 1 << 20, max_wait_ms: int = 3000
) -> int:
    """Raw gets of partition 0 from offset 0 until ``expected`` records came; returns the bytes read.

    ``decode=False`` only delimits records (what the broker's own figure is about);
    ``decode=True`` also CRC-checks and decodes each one, as every consumer must.
    """
    offset, got, nbytes = 0, 0, 0
    while got < expected:
        reply = await conn.request(
            GetRequest(topic=topic, partition=0, offset=offset, max_size=max_size, max_wait_ms=max_wait_ms).to_header()
        )
        if reply.code != 200:
            raise RuntimeError(f"fetch of {topic} at {offset}: {reply.code} {reply.message}")
        if decode:
            records = list(iter_records(reply.body, offset))
            got += len(records)
            offset = records[-1].offset + records[-1].size
        else:
            ends = record_ends(reply.body, offset)
            got += len(ends)
            offset = ends[-1]
        nbytes += len(reply.body)
    return nbytes
