"""Broker-side CPU and byte cost of the idempotence layer per put (no network, no disk).

Measures, for batches of N messages of S bytes, the put handler's work without
the transaction layer (validate the batch, append it to a buffer) and with it
(validate, ``plan_put``: dedup verdict + BATCH header, append,
``PartitionTxnState.appended``), and a slave's ``catch_up`` over the same bytes. The end-to-end cost
over the network is for the wired broker to measure; this bounds the CPU part.

    PYTHONPATH=. python bench/txn_overhead.py [--puts 20000]
"""

from __future__ import annotations

import argparse
import time

from metaq.record import encode_batch, validate_batch
from metaq.txn.put import BATCH_HEADER_SIZE, plan_put
from metaq.txn.rebuild import PartitionTxnState


def run(puts: int, count: int, size: int, idempotent: bool) -> float:
    batch = encode_batch([(b"x" * size, None)] * count)
    log = bytearray()
    state = PartitionTxnState()

    def read(offset: int, length: int) -> bytes:
        return bytes(log[offset:offset + length])  # a copy: a view would stop the buffer from growing

    started = time.perf_counter()
    for seq in range(puts):
        validate_batch(batch, 1 << 20)
        if idempotent:
            plan = plan_put(state.producers, batch, count, producer_id=1, producer_epoch=0,
                            first_seq=(seq * count) & 0x7FFFFFFF, timestamp_ms=seq)
            at = len(log)
            log += plan.append
            state.appended(at, plan.append, plan.header)
        else:
            log += batch
    return (time.perf_counter() - started) / puts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=20000)
    args = parser.parse_args()
    print(f"{'messages/put':>12} {'bytes/msg':>9} {'plain us/put':>12} {'idempotent us/put':>17} {'extra bytes/put':>15}")
    for count, size in ((1, 256), (10, 256), (100, 256), (1, 4096)):
        plain = run(args.puts, count, size, False)
        idem = run(args.puts, count, size, True)
        print(f"{count:>12} {size:>9} {plain:>12.1f} {idem:>17.1f} {BATCH_HEADER_SIZE:>15}")


if __name__ == "__main__":
    main()
