"""Clients across a failover: the producer pauses and re-routes, the consumer keeps its place.

Sync pair A (master) / B (slave 1), ZK session 1500 ms. A blocking ``MessageProducer``
sends one message at a time from a thread while A is killed with SIGKILL; a consumer
group reads the topic throughout (``read_from=master``: A, then B).

What docs/client.md promises and this checks: a send ends in one SendResult; retriable
failures (403/503, refused connections, no master yet) are retried within
``send_max_attempts`` / ``send_timeout_s``, so none of them reaches the application; a put
whose outcome is unknown (the connection died after sending) is resent while
``retry_unknown_outcome`` is on, or reported as ``outcome_unknown`` — at most the one send
in flight at the kill. Every successful send is on the new master at the offset its
SendResult names, and the consumer delivers it at that same offset.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from metaq.client import ConsumerConfig, Message, MessageSessionFactory, MetaClientConfig

from .failover_support import TOPIC, Group, fetch_all, make_pair, sync_system, wait_leads, wait_until


def test_producer_reroutes_and_consumer_keeps_offsets(broker_factory, zk, zk_client, zk_root, tmp_path):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    epoch_before = group.epoch()

    config = MetaClientConfig(
        zk_connect=zk.connect_string,
        zk_root=zk_root,
        zk_session_timeout_ms=4000,
        request_timeout_s=5,
        # Enough retries to cover detection (the brokers' 1.5 s ZK session) and election.
        send_max_attempts=30,
        send_timeout_s=15,
        send_retry_max_wait_s=0.5,
    )
    consumed: list[Message] = []
    lock = threading.Lock()

    def on_message(message: Message) -> None:
        with lock:
            consumed.append(message)

    with MessageSessionFactory(config) as factory:
        producer = factory.create_producer()
        producer.publish(TOPIC)
        consumer = factory.create_consumer(
            ConsumerConfig(group="fo-readers", from_beginning=True, offset_store_path=None, recover_dir=str(tmp_path / "rec"))
        )
        consumer.subscribe(TOPIC, 1 << 20, on_message)
        consumer.complete_subscribe()

        results = []
        send_times: list[tuple[float, float]] = []
        stop = threading.Event()

        def produce() -> None:
            n = 0
            while not stop.is_set():
                started = time.monotonic()
                result = producer.send_message(Message(TOPIC, f"c-{n:06d}".encode()))
                send_times.append((started, time.monotonic()))
                results.append((n, result))
                n += 1

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        wait_until(lambda: sum(r.success for _, r in results) >= 100, 20, message="100 sends before the kill")
        killed_at = time.monotonic()
        a.kill()
        wait_leads(b, group, epoch_before)
        wait_until(
            lambda: any(r.success and s > killed_at for (_, r), (s, _e) in zip(results, send_times)),
            20,
            message="a send started after the kill to succeed",
        )
        time.sleep(1.0)
        stop.set()
        thread.join(30)
        assert not thread.is_alive()

        outcomes = Counter(
            "ok" if r.success else ("unknown" if r.outcome_unknown else f"failed {r.code}") for _, r in results
        )
        longest = max(e - s for s, e in send_times)
        print(f"\nproducer across the failover: {dict(outcomes)}; longest send {longest:.2f}s")
        failed = [r for _, r in results if not r.success and not r.outcome_unknown]
        assert not failed, [r.error_message for r in failed[:3]]
        unknown = [r for _, r in results if r.outcome_unknown]
        assert len(unknown) <= 1, [r.error_message for r in unknown]
        assert longest > 0.5, "the kill should have been seen as a pause"

        # Every successful send is on B at its offset; sends after the kill went to B.
        ok = [(n, r) for n, r in results if r.success]
        on_b = fetch_all(b)
        for n, r in ok:
            assert r.partition.broker_id == 0
            assert on_b.get(r.offset) == f"c-{n:06d}".encode(), (n, r)

        # The consumer delivers every one of them at the same offset, across the switch.
        def caught_up() -> bool:
            with lock:
                seen = {m.offset: m.data for m in consumed}
            return all(seen.get(r.offset) == f"c-{n:06d}".encode() for n, r in ok)

        wait_until(caught_up, 20, message="the consumer to deliver every acked message")
        with lock:
            offsets = [m.offset for m in consumed]
        # In order per partition; a redelivery (at least once) repeats an offset, never skips one.
        assert sorted(set(offsets)) == sorted(set(offsets) & set(on_b))
        consumer.shutdown()
        producer.close()
