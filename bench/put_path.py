"""The broker's Python request path for one put, without sockets: CPU time per put.

    python bench/put_path.py                 # 20,000 single-message puts, best of 5 runs
    python bench/put_path.py --n 50000 --runs 7
    python bench/put_path.py --calls --n 5000  # cProfile's count of calls per put instead, and the top functions

An in-process broker (``zk.zkEnable=false``, default flush policy) gets pre-encoded put
frames through ``ClientConnection.data_received`` of a connection whose transport only
counts bytes, one frame per read, as a blocking producer sends them. A second connection
holds a slave's replica fetch parked at the log end, as an async master's slave does: each
put wakes it (the reply is read from the segment and written) and the next fetch, at the new
end, parks again. So a put here is what the master runs in Python for one blocking send on
an async pair, minus the kernel (no ``send``, no wake-up of another process): the frame
decode, the request parse, the handler, the append (``pwrite``, ``fstat``), the ack, the
slave's reply and its next fetch. ``time.process_time`` of the loop, per put; the best of
``--runs`` (the machine's other load only ever adds to it). Also the median time from a put's
``data_received`` to its ack's ``transport.write`` (what a producer waits for in the broker,
less the kernel): whether the slave's reply is built and written before the ack or after it.
And the cyclic garbage collector's runs during the puts (``gc.callbacks``): how many per
1,000 puts and the longest, i.e. whether the put path leaves reference cycles behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metaq import record  # noqa: E402
from metaq.config import parse_server_ini  # noqa: E402
from metaq.protocol.frames import encode_frame  # noqa: E402
from metaq.server.broker import Broker  # noqa: E402
from metaq.server.connection import ClientConnection, ConnectionLimits  # noqa: E402

SERVER_INI = """\
[system]
brokerId=0
hostName=127.0.0.1
serverPort=0
dataPath={data}

[zookeeper]
zk.zkEnable=false

[topic=bench]
numPartitions=1
"""
SLAVE_ID = 0


class CountingTransport:
    """What a connection uses of its transport: bytes written are counted, nothing is sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.written = 0
        self.written_at = 0.0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.written_at = time.perf_counter()

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", self.port) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


class RegisteredSlave:
    """Stands in for the ZooKeeper registry of a broker without ZooKeeper: it names slave 0."""

    slave_ids = frozenset({SLAVE_ID})

    async def stop(self, sync_time_ms: int | None = None) -> None:
        pass


def replica_fetch(opaque: int, offset: int) -> bytes:
    return encode_frame({"op": "get", "opaque": opaque, "topic": "bench", "partition": 0, "offset": offset,
                         "max_size": 1 << 20, "max_wait_ms": 60_000,
                         "replica": {"slave_id": SLAVE_ID, "epoch": 0, "log_end": offset}})


async def one_run(work: Path, n: int, payload: bytes) -> tuple[float, float]:
    """CPU seconds per put over ``n`` puts on a fresh broker, and the median seconds to each ack."""
    ini = work / "server.ini"
    ini.write_text(SERVER_INI.format(data=work / "data"))
    broker = Broker(parse_server_ini(ini.read_bytes(), str(ini)))
    await broker.start()
    broker.registry = RegisteredSlave()
    config = broker.config

    def connection(port: int) -> tuple[ClientConnection, CountingTransport]:
        conn = ClientConnection(broker.handlers, config.max_request_body, ConnectionLimits.from_config(config),
                                broker.security, broker.slots, broker.request_budget, broker.authz, broker.waiters)
        transport = CountingTransport(port)
        conn.connection_made(transport)  # type: ignore[arg-type]
        return conn, transport

    try:
        producer, producer_out = connection(1)
        slave, slave_out = connection(2)
        message = bytes(record.encode_record(payload))
        puts = [encode_frame({"op": "put", "opaque": i, "topic": "bench", "partition": 0, "count": 1}, message)
                for i in range(n)]
        end = broker.store.get_log("bench", 0).log_end
        slave.data_received(replica_fetch(0, end))
        to_ack = []
        with collector_runs() as collections:
            elapsed = put_all(producer, producer_out, slave, slave_out, puts, end, len(message), to_ack)
        assert producer_out.written > 0
        producer.connection_lost(None)
        slave.connection_lost(None)
        return elapsed / n, sorted(to_ack)[n // 2], collections
    finally:
        await broker.stop()


def put_all(producer: ClientConnection, producer_out: "CountingTransport", slave: ClientConnection,
            slave_out: "CountingTransport", puts: list[bytes], end: int, size: int, to_ack: list[float]) -> float:
    """Every put, each waking the parked replica fetch, which parks again: process seconds."""
    started = time.process_time()
    for i, frame in enumerate(puts):
        replied, acked = slave_out.written, producer_out.written
        received = time.perf_counter()
        producer.data_received(frame)
        to_ack.append(producer_out.written_at - received)
        assert slave_out.written > replied, "the parked replica fetch was not answered"
        assert producer_out.written > acked, "the put was not acked"
        end += size
        slave.data_received(replica_fetch(i + 1, end))
    return time.process_time() - started


@contextlib.contextmanager
def collector_runs() -> Iterator[list[float]]:
    """The seconds of each run of the cyclic garbage collector inside the block."""
    runs: list[float] = []
    began = [0.0]

    def timed(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            runs.append(time.perf_counter() - began[0])

    gc.collect()  # the set-up's garbage is not the puts'
    gc.callbacks.append(timed)
    try:
        yield runs
    finally:
        gc.callbacks.remove(timed)


def count_calls(n: int, payload: bytes, top: int) -> None:
    """One run's puts under cProfile: calls per put (of Python functions, the rest builtins), and the most called."""
    global put_all
    timed = put_all
    profile = cProfile.Profile()

    def profiled(*args: Any) -> float:
        profile.enable()
        try:
            return timed(*args)
        finally:
            profile.disable()

    put_all = profiled
    try:
        with tempfile.TemporaryDirectory(prefix="put-path-") as work:
            asyncio.run(one_run(Path(work), n, payload))
    finally:
        put_all = timed
    calls = {key: row[1] / n for key, row in pstats.Stats(profile).stats.items()}
    in_python = sum(c for (file, _line, _func), c in calls.items() if file != "~")
    print(f"put path: {sum(calls.values()):.1f} calls per put ({in_python:.1f} of Python functions)")
    for (file, line, func), c in sorted(calls.items(), key=lambda item: -item[1])[:top]:
        print(f"  {c:6.2f}  {func if file == '~' else f'{Path(file).name}:{line}({func})'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="puts per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", type=int, default=100, help="message bytes")
    parser.add_argument("--calls", action="store_true", help="count calls per put with cProfile (one run; no timing)")
    parser.add_argument("--top", type=int, default=25, help="with --calls: the functions listed")
    args = parser.parse_args(argv)
    payload = b"x" * args.size
    if args.calls:
        count_calls(args.n, payload, args.top)
        return 0
    per_put, to_ack, collections = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="put-path-") as work:
            cpu, ack, runs = asyncio.run(one_run(Path(work), args.n, payload))
            per_put.append(cpu)
            to_ack.append(ack)
            collections += runs
    runs = " / ".join(f"{p * 1e6:.1f}" for p in per_put)
    acks = " / ".join(f"{a * 1e6:.1f}" for a in to_ack)
    print(f"put path (put + ack + the parked replica fetch's reply and next fetch): best {min(per_put) * 1e6:.1f} us"
          f" CPU per put (runs: {runs}); put read -> ack written, median: best {min(to_ack) * 1e6:.1f} us (runs: {acks})")
    print(f"cyclic GC during the puts: {1000 * len(collections) / (args.n * args.runs):.1f} runs per 1,000 puts,"
          f" {1e6 * sum(collections) / (args.n * args.runs):.1f} us per put, longest {1e3 * max(collections, default=0):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
