"""A forged, divergent master answer stops the slave's partition instead of corrupting it.

A tiny fake master (an asyncio server speaking the metaq protocol through
``metaq.protocol.frames``) registers itself in ZooKeeper as the group's master.
It first serves valid records on every partition; once the test flips it to
"evil", it answers the next replica fetch of partition 0 at the wrong offset,
of partition 1 with a record whose CRC is wrong, and of partition 2 with a log
end smaller than the slave's. Partition 3 stays honest and keeps growing. The
real slave process must stop partitions 0-2 with a clear error, leave their logs
untouched (log end and bytes), and keep replicating partition 3.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from pathlib import Path

from metaq.addresses import broker_url
from metaq.cli.cluster import collect, unhealthy
from metaq.protocol.frames import CLOSED, NEED_DATA, Frame, FrameDecoder, encode_frame
from metaq.record import encode_record
from metaq.zk.paths import ZkPaths
from metaq.zk.embedded import free_port
from metaq.tools.launcher import read_segments
from tests.integration.replication_support import replica_rows, wait_for

TOPIC = "forged"
PARTITIONS = 4
HONEST = 3


def records(partition: int, start: int, count: int) -> bytes:
    return b"".join(
        encode_record(f"p{partition}-m{i:05d}".encode() * 3, msg_id=(partition << 32) + i) for i in range(start, start + count)
    )


class FakeMaster:
    def __init__(self) -> None:
        self.host, self.port = "127.0.0.1", free_port("127.0.0.1")
        self.logs = {p: bytearray(records(p, 0, 40)) for p in range(PARTITIONS)}
        self.evil = False
        self.evil_answers: dict[int, int] = {}
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "FakeMaster":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, self.host, self.port))
        self._ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(allow_text=False)
        try:
            while True:
                data = await reader.read(65536)
                decoder.receive_data(data)
                while True:
                    event = decoder.next_event()
                    if event is NEED_DATA:
                        break
                    if event is CLOSED or not isinstance(event, Frame):
                        return
                    header, body = await self._answer(event.header)
                    writer.write(encode_frame({**header, "opaque": event.header["opaque"]}, body))
                if not data:
                    return
        finally:
            writer.close()

    async def _answer(self, req: dict) -> tuple[dict, bytes]:
        op = req.get("op")
        if op == "topics":
            return {"code": 200, "topics": {TOPIC: PARTITIONS}, "broker_id": 0, "role": "master", "epoch": 0}, b""
        if op == "offset":
            end = len(self.logs[req["partition"]])
            return {"code": 200, "offset": 0, "min_offset": 0, "max_offset": end}, b""
        # Who answers (ha/answerer.py): the master of epoch 0, the epoch ZooKeeper names (no epoch node).
        if op == "epoch_end":  # the slave's start-up truncation check: nothing to cut
            return {"code": 200, "epoch": req["epoch"], "end_offset": len(self.logs[req["partition"]]),
                    "role": "master", "serving_epoch": 0}, b""
        if op == "epochs":
            return {"code": 200, "entries": [[0, 0]], "role": "master", "serving_epoch": 0}, b""
        if op != "get":
            return {"code": 400, "msg": f"fake master does not do {op}"}, b""
        partition, offset = req["partition"], req["offset"]
        log = self.logs[partition]
        end = len(log)
        meta = {"committed": end, "log_end": end}
        if self.evil and partition != HONEST and offset == end:
            self.evil_answers[partition] = self.evil_answers.get(partition, 0) + 1
            if partition == 0:  # bytes from another offset than asked for
                return {"code": 200, "offset": offset + 20, **meta}, records(0, 100, 3)
            if partition == 1:  # a complete record whose CRC does not match its payload
                bad = bytearray(records(1, 100, 2))
                struct.pack_into(">i", bad, 4, struct.unpack_from(">i", bad, 4)[0] ^ 0x5A5A)
                return {"code": 200, "offset": offset, "committed": end + len(bad), "log_end": end + len(bad)}, bytes(bad)
            # partition 2: a master log shorter than the slave's
            return {"code": 404, "msg": "no new messages", "committed": end - 30, "log_end": end - 30}, b""
        if offset < end:
            chunk = bytes(log[offset : offset + min(req.get("max_size", 65536), 65536)])
            return {"code": 200, "offset": offset, **meta}, chunk
        await asyncio.sleep(min(req.get("max_wait_ms", 0), 200) / 1000)
        return {"code": 404, "msg": "no new messages", **meta}, b""


def partition_bytes(slave_dir: Path, partition: int) -> bytes:
    return read_segments(slave_dir / "data" / f"{TOPIC}-{partition}")[1]


def test_forged_divergent_answers_stop_the_partition(broker_factory, zk, zk_client, zk_root):
    fake = FakeMaster().start()
    try:
        paths = ZkPaths(zk_root)
        zk_client.create(paths.master(0), broker_url(fake.host, fake.port).encode(), makepath=True, ephemeral=True)
        slave = broker_factory(
            0, {TOPIC: PARTITIONS}, system={"unflushThreshold": 1, "autoFailover": False}, slave_props={"slaveId": 0, "autoSyncMasterConfig": False}
        )

        def copied() -> bool:
            rows = replica_rows(slave)
            return len(rows) == PARTITIONS and all(
                int(rows[(TOPIC, p)]["log_end"]) == len(fake.logs[p]) for p in range(PARTITIONS)
            )

        wait_for(copied, 15, "the slave to copy the fake master's valid records")
        before = {p: partition_bytes(slave.dir, p) for p in range(PARTITIONS)}
        assert all(before[p] == bytes(fake.logs[p]) for p in range(PARTITIONS))

        fake.evil = True
        rows = wait_for(
            lambda: (r := replica_rows(slave)) and all(r[(TOPIC, p)]["state"] == "stopped" for p in range(3)) and r,
            15, "partitions 0-2 to stop",
        )
        assert "asked for offset" in rows[(TOPIC, 0)]["error"]
        assert "CRC" in rows[(TOPIC, 1)]["error"]
        assert "before this slave's log end" in rows[(TOPIC, 2)]["error"]
        for p in range(3):
            assert int(rows[(TOPIC, p)]["divergences"]) == 1
            assert rows[(TOPIC, p)]["log_end"] == str(len(fake.logs[p])), rows[(TOPIC, p)]
            assert fake.evil_answers[p] == 1, "a stopped partition must not fetch again"
        # metaq cluster names the slave's stopped partitions as unhealthy.
        members = asyncio.run(collect(zk.connect_string, zk_root))
        lines = [line for line in unhealthy(members) if "slave0" in line]
        assert len(lines) == 1 and "stopped replicating 3 partition(s): forged-0-0, forged-0-1, forged-0-2" in lines[0], lines
        assert "CRC" in lines[0] or "offset" in lines[0], lines

        # The honest partition keeps replicating, byte for byte.
        fake.loop.call_soon_threadsafe(fake.logs[HONEST].extend, records(HONEST, 40, 25))
        wait_for(
            lambda: replica_rows(slave)[(TOPIC, HONEST)]["log_end"] == str(len(fake.logs[HONEST])),
            15, "the honest partition to replicate new records",
        )
        assert replica_rows(slave)[(TOPIC, HONEST)]["state"] == "following"
        assert partition_bytes(slave.dir, HONEST) == bytes(fake.logs[HONEST])
        # The stopped partitions' bytes are exactly what they were.
        for p in range(3):
            assert partition_bytes(slave.dir, p) == before[p]
        assert slave.alive
    finally:
        fake.stop()
