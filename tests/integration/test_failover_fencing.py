"""Split brain: a SIGSTOPped master that wakes up after its ZK session expired acks nothing.

Sync pair A (master) / B (slave 1), ZK session 1500 ms. A put stream runs against A;
A is stopped for 4 s, B takes over meanwhile. While A is stopped a fresh connection is
opened to A and a put sent (the kernel queues it in A's socket buffer). After SIGCONT:
that put is not acked (a refusal with a message, or a closed connection), A rejoins as
B's slave, and every put acked in the whole test is in B's log at its acked offset.
"""

from __future__ import annotations

import asyncio
import threading
import time

from metaq.client.connection import BrokerConnection
from metaq.record import encode_batch
from metaq.tools.launcher import wait_until

from .failover_support import (
    TOPIC,
    Group,
    PutStream,
    assert_identical,
    disk_records,
    fetch_all,
    make_pair,
    missing_acks,
    put_one,
    stat,
    sync_system,
    wait_follows,
    wait_leads,
)
from .replication_support import wait_caught_up

STOP_SECONDS = 4.0


class LatePut:
    """A put sent to a stopped broker from its own thread and loop; ``result`` is the reply or the error."""

    def __init__(self, address: tuple[str, int], payload: bytes) -> None:
        self.address, self.payload = address, payload
        self.sent = threading.Event()
        self.result: object = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        try:
            conn = await BrokerConnection.open(*self.address, timeout=2)  # accepted by A's kernel
            future = conn.send({"op": "put", "topic": TOPIC, "partition": 0}, encode_batch([(self.payload, None)]))
            self.sent.set()
            try:
                self.result = await asyncio.wait_for(future, 20)
            finally:
                conn.close()
        except Exception as exc:  # connection closed / refused: not acked either
            self.result = exc
            self.sent.set()

    def join(self) -> object:
        self._thread.join(30)
        assert not self._thread.is_alive()
        return self.result


def test_stopped_master_acks_nothing_after_takeover(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    epoch_before = group.epoch()

    stream = PutStream(a.address, tag="a", window=4).start()
    stream.wait_acked(100)
    acked_before_stop = len(stream.acked)
    a.pause()
    stopped_at = time.monotonic()
    try:
        epoch = wait_leads(b, group, epoch_before, timeout=STOP_SECONDS + 6)
        took_over_after = time.monotonic() - stopped_at
        late = LatePut(a.address, b"late-put-to-the-stopped-master")
        assert late.sent.wait(5)
        # B takes writes while A is still stopped: at once after it has published its term's
        # sync set (puts before that are refused with 503, never acked).
        wait_until(lambda: put_one(b, b"b-first").code == 200, 5, message="B takes writes")
        for i in range(5):
            assert put_one(b, f"b-{i}".encode()).code == 200
        time.sleep(max(0.0, STOP_SECONDS - (time.monotonic() - stopped_at)))
    finally:
        a.resume()
    print(f"\nsplit brain: B led in epoch {epoch} {took_over_after:.2f}s after SIGSTOP of A; A resumed after "
          f"{time.monotonic() - stopped_at:.2f}s")

    result = late.join()
    code = getattr(result, "code", None)
    assert code != 200, f"the stopped master acked a put after B took over: {getattr(result, 'header', result)}"
    if code is not None:
        assert code in (403, 503), result.header
        assert result.message, "a refusal must say why"
    print(f"late put to the old master: {code or type(result).__name__}: {getattr(result, 'message', result)}")

    # A rejoins as B's slave.
    wait_follows(a, b, group)
    stream.stop()
    acked_after_stop = stream.acked[acked_before_stop:]
    print(f"stream: {len(stream.acked)} acked ({len(acked_after_stop)} after SIGSTOP), "
          f"{len(stream.refused)} refused, {len(stream.unknown)} unknown")
    # 403/503: refused, not stored; 504: puts that were waiting for the sync ack when A
    # fenced itself (outcome unknown). Never a 200 from A after the takeover (below).
    assert all(code in (403, 503, 504) for code, _msg, _p in stream.refused), stream.refused[:3]

    # No write acked by A after B's takeover: every ack of the test is in B's log at its offset.
    wait_caught_up(b, a, [(TOPIC, 0)])
    on_b = fetch_all(b)
    assert not missing_acks(stream.acked, on_b)
    assert b"late-put-to-the-stopped-master" not in on_b.values()
    assert b"late-put-to-the-stopped-master" not in disk_records(a).values()
    assert stat(a, "ha_state") == "following"
    assert_identical(b, slaves=1)
