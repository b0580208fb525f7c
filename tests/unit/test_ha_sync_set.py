"""SyncReplication (metaq/ha/sync_set.py) without a server: a fake ZooKeeper publish, a fake clock.

The rules under test (see the module docstring): a slave joins the sync set only
when it is caught up on every partition, acks wait for joining slaves before they
are published, a put is acked when every counted slave reported a log end at or
past its end, a lagging member leaves and the smaller set is **published before**
any waiting put is released, reject -> 503 before the append / 504 for waiting
puts, degrade -> the master alone, committed never decreases, a failing publish
keeps the old set and retries, a closed replication connection removes at once.

The periodic checker runs on real asyncio time (every ``min(0.1, timeout/4)`` s);
the clock it reads is the fake one, so tests advance ``h.now`` and then let the
loop run (``settle``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.ha.progress import ReplicationProgress
from metaq.ha.sync_set import SyncReplication, SyncWaitFailed
from metaq.protocol import commands as c
from metaq.txn.batch_spans import BatchSpans

T0 = ("t", 0)
T1 = ("t", 1)
EPOCH = 7


@dataclass
class Put:
    key: tuple[str, int]
    end: int
    code: int | None = None  # None while waiting
    appended: bool = True
    message: str = ""


@dataclass
class Harness:
    """A fake master around one SyncReplication: logs are just end offsets."""

    min_sync: int = 1
    timeout_ms: int = 1000
    on_loss: str = "reject"
    partitions: tuple[tuple[str, int], ...] = (T0,)
    now: float = 1000.0
    events: list[tuple[Any, ...]] = field(default_factory=list)
    published: list[frozenset[int]] = field(default_factory=list)
    fail_publishes: int = 0
    gate: asyncio.Event | None = None
    #: True: group commit done at once. False: unflushThreshold>0 (acks do not wait for
    #: the flush; ``flushed`` moves only when the test says so).
    flush_at_once: bool = True

    def __post_init__(self) -> None:
        self.ends = {key: 0 for key in self.partitions}
        self.flushed = {key: 0 for key in self.partitions}
        self.committed_events = 0
        #: Where the batches (idempotent puts: ``put(batch=True)``) lie, as the txn state knows them.
        self.batches = {key: BatchSpans() for key in self.partitions}
        #: The one record of slave positions (the master's ReplicationProgress).
        self.progress = ReplicationProgress(clock=lambda: self.now)
        self.sync = SyncReplication(
            self.min_sync,
            self.timeout_ms,
            self.on_loss,
            self._publish,
            log_end=lambda t, p: self.ends[(t, p)],
            flushed_end=lambda t, p: self.flushed[(t, p)],
            partitions=lambda: list(self.ends),
            position=lambda slave, t, p: self.progress.position(slave, t, p, epoch=EPOCH),
            on_committed=self._on_committed,
            clock=lambda: self.now,
            batch_boundary=lambda t, p, offset, committed: self.batches[(t, p)].committed_bound(offset, committed),
        )

    def _on_committed(self, topic: str, partition: int) -> None:
        self.committed_events += 1

    async def _publish(self, members: frozenset[int]) -> None:
        self.events.append(("publish-start", sorted(members)))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_publishes > 0:
            self.fail_publishes -= 1
            self.events.append(("publish-failed", sorted(members)))
            raise ConnectionError("zookeeper unreachable (fake)")
        self.published.append(members)
        self.events.append(("published", sorted(members)))

    @property
    def zk_set(self) -> frozenset[int]:
        return self.published[-1] if self.published else frozenset()

    # --- the put path of handlers.py: refusal, append, wait -----------------------------

    def put(self, size: int = 100, key: tuple[str, int] = T0, batch: bool = False) -> Put:
        refusal = self.sync.refusal()
        if refusal is not None:
            self.events.append(("refused", key))
            return Put(key, self.ends[key], refusal[0], appended=False, message=refusal[1])
        if batch:
            self.batches[key].add(self.ends[key], self.ends[key] + size)
        self.ends[key] += size
        if self.flush_at_once:
            self.flushed[key] = self.ends[key]  # group commit done at once: only the sync wait matters here
        put = Put(key, self.ends[key])
        try:
            wait = self.sync.wait(key[0], key[1], put.end)
        except SyncWaitFailed as exc:
            put.code, put.message = exc.code, exc.message
            return put
        if wait is None:
            self._acked(put)
            return put

        def done(future: "asyncio.Future[None]") -> None:
            exc = future.exception()
            if exc is None:
                self._acked(put)
            else:
                assert isinstance(exc, SyncWaitFailed)
                put.code, put.message = exc.code, exc.message
                self.events.append(("failed", put.end, exc.code))

        asyncio.ensure_future(wait).add_done_callback(done)
        return put

    def _acked(self, put: Put) -> None:
        put.code = c.OK
        self.events.append(("acked", put.end))

    def report(self, slave: int, position: int | None = None, key: tuple[str, int] = T0) -> None:
        """Slave ``slave`` fetches at ``position`` (default: it has the whole log)."""
        self.progress.fetched(slave, key[0], key[1], self.ends[key] if position is None else position, EPOCH)
        self.sync.slave_position(slave, key[0], key[1])

    def report_all(self, slave: int) -> None:
        for key in self.ends:
            self.report(slave, key=key)

    async def join(self, *slaves: int) -> None:
        for slave in slaves:
            self.report_all(slave)
        await settle()
        assert set(slaves) <= self.sync.members, self.events


async def settle(seconds: float = 0.0) -> None:
    """Let scheduled tasks (publish, checker) run."""
    for _ in range(5):
        await asyncio.sleep(0)
    if seconds:
        await asyncio.sleep(seconds)
        for _ in range(5):
            await asyncio.sleep(0)


def run(coro_fn):
    """Run an async test body with its own loop; stops the checker afterwards."""

    async def wrapper(h: Harness) -> None:
        await h.sync.start()
        try:
            await coro_fn(h)
        finally:
            await h.sync.stop()

    return wrapper


def scenario(**kwargs: Any):
    def decorate(fn):
        def test() -> None:
            asyncio.run(run(fn)(Harness(**kwargs)))

        test.__name__ = fn.__name__
        test.__doc__ = fn.__doc__
        return test

    return decorate


# --- start, join ------------------------------------------------------------------------------


@scenario()
async def test_start_publishes_empty_set_and_reject_refuses_before_append(h: Harness) -> None:
    assert h.published == [frozenset()]
    put = h.put()
    assert put.code == c.SERVICE_UNAVAILABLE and not put.appended
    assert h.ends[T0] == 0, "a refused put must not be written"
    assert "minSyncSlaves=1" in put.message and "nothing was stored" in put.message


@scenario(partitions=(T0, T1))
async def test_join_only_when_caught_up_on_every_partition(h: Harness) -> None:
    # The log holds data from before this master started (nobody counted: the bar is the log end).
    h.ends[T0] = h.ends[T1] = 500
    h.report(0, 500, T0)
    await settle()
    assert h.sync.joining == set() and h.sync.members == frozenset()
    h.report(0, 400, T1)
    await settle()
    assert h.sync.joining == set() and h.sync.members == frozenset()
    h.report(0, 500, T1)
    await settle()
    assert h.sync.members == {0}
    assert h.published[-1] == {0}
    put = h.put()
    assert put.code is None, "with a member, a put waits for it"


@scenario(on_loss="degrade")
async def test_joining_slave_is_waited_for_before_it_is_published(h: Harness) -> None:
    h.gate = asyncio.Event()  # ZooKeeper is slow
    h.report(0)
    await settle()
    assert h.sync.joining == {0} and h.sync.members == frozenset()
    assert h.events[-1] == ("publish-start", [0])
    put = h.put()  # degrade with nobody published, but a slave is joining: it is waited for
    await settle()
    assert put.code is None
    h.report(0)  # the slave fetched past the put
    await settle()
    assert put.code == c.OK
    h.gate.set()
    await settle()
    assert h.sync.members == {0} and h.sync.joining == set()


@scenario(on_loss="degrade")
async def test_degrade_join_needs_the_whole_log_not_just_committed(h: Harness) -> None:
    """Regression: with nobody counted, puts up to the log end are acked (after the master's
    flush, or at once with unflushThreshold>0) while committed may be lower; a slave that joined
    at committed would be named in ZooKeeper without those acked messages."""
    h.ends[T0], h.flushed[T0] = 1000, 600
    assert h.sync.committed(*T0) == 600
    h.report(0, 700)
    await settle()
    assert h.sync.counted == set() and h.published == [frozenset()]
    h.report(0, 1000)
    await settle()
    assert h.sync.members == {0}


@scenario(partitions=(T0, T1))
async def test_later_slave_joins_at_committed_while_others_are_counted(h: Harness) -> None:
    await h.join(0)
    put = h.put(100, T0)
    h.report(0, key=T0)
    await settle()
    assert put.code == c.OK and h.sync.committed(*T0) == 100
    h.put(100, T0)  # waiting: log end 200, committed 100
    h.report(1, 100, T0)
    h.report(1, 0, T1)
    await settle()
    assert h.sync.members == {0, 1}, "caught up to committed is enough when acks wait for members"


# --- acks ------------------------------------------------------------------------------------


@scenario()
async def test_ack_waits_for_every_counted_slave(h: Harness) -> None:
    await h.join(0, 1)
    put = h.put()
    h.report(0)
    await settle()
    assert put.code is None, "one of two members is not enough"
    h.report(1)
    await settle()
    assert put.code == c.OK


@scenario()
async def test_waiting_put_resolves_when_a_position_past_its_end_arrives(h: Harness) -> None:
    await h.join(0)
    first = h.put(100)
    second = h.put(100)
    h.report(0, 99)
    await settle()
    assert first.code is None and second.code is None
    h.report(0, 100)
    await settle()
    assert first.code == c.OK and second.code is None
    third = h.put(100)
    h.report(0, 250)  # past the second put's end (not yet the third's)
    await settle()
    assert second.code == c.OK and third.code is None
    assert h.sync.committed(*T0) == 250


@scenario()
async def test_a_position_from_an_earlier_epoch_never_counts(h: Harness) -> None:
    """Positions outlive terms (one record, ReplicationProgress): only this epoch's count."""
    h.ends[T0] = 500
    h.progress.fetched(0, "t", 0, 500, EPOCH - 1)  # said while another master led
    h.sync.slave_position(0, "t", 0)
    await settle()
    assert h.sync.joining == set() and h.sync.members == frozenset()
    h.report(0, 500)  # the same position, reported in this epoch
    await settle()
    assert h.sync.members == {0}


@scenario()
async def test_a_position_past_our_log_end_counts_as_nothing(h: Harness) -> None:
    await h.join(0)
    put = h.put(100)
    h.report(0, 400)  # a divergent tail: longer than our log
    await settle()
    assert put.code is None and h.sync.committed(*T0) == 0
    h.report(0, 100)
    await settle()
    assert put.code == c.OK


@scenario()
async def test_put_already_replicated_is_acked_without_waiting(h: Harness) -> None:
    await h.join(0)
    h.report(0, 10_000)  # past the master's end: a divergent slave log, never counted
    put = h.put(100)
    assert put.code is None, "a position past the log end is ignored: the put waits"
    h.report(0)
    await settle()
    assert put.code == c.OK


# --- leaving -----------------------------------------------------------------------------------


@scenario(timeout_ms=400)
async def test_lagging_member_removed_and_smaller_set_published_before_put_released(h: Harness) -> None:
    await h.join(0, 1)
    put = h.put()
    h.gate = asyncio.Event()  # hold the ZooKeeper write to observe the order
    h.now += 0.5  # past syncSlaveTimeoutMs for the put; slave 1 never reported
    h.report(0)  # slave 0 has it (and is fresh)
    await settle(0.25)
    assert h.events[-1] == ("publish-start", [0])
    assert put.code is None, "no ack may stop waiting for slave 1 before ZooKeeper drops it"
    assert h.sync.members == {0, 1}
    h.gate.set()
    await settle()
    assert put.code == c.OK
    published = h.events.index(("published", [0]))
    acked = h.events.index(("acked", put.end))
    assert published < acked
    assert h.sync.members == {0} and h.sync.removals == 1


@scenario(timeout_ms=400)
async def test_silent_member_removed_even_without_waiting_puts(h: Harness) -> None:
    await h.join(0)
    h.now += 0.3
    await settle(0.2)
    assert h.sync.members == {0}
    h.sync.slave_heard(0)  # a heartbeat keeps it
    h.now += 0.3
    await settle(0.2)
    assert h.sync.members == {0}
    h.now += 0.5
    await settle(0.2)
    assert h.sync.members == frozenset() and h.zk_set == frozenset()


@scenario(timeout_ms=400)
async def test_reject_waiting_put_gets_504_then_new_puts_503_before_append(h: Harness) -> None:
    await h.join(0)
    waiting = h.put()
    h.now += 0.5
    await settle(0.25)
    assert h.zk_set == frozenset()
    assert waiting.code == c.GATEWAY_TIMEOUT and "outcome unknown" in waiting.message
    assert h.events.index(("published", [])) < h.events.index(("failed", waiting.end, c.GATEWAY_TIMEOUT))
    end = h.ends[T0]
    refused = h.put()
    assert refused.code == c.SERVICE_UNAVAILABLE and h.ends[T0] == end
    # The slave catches up (it gets the 504'd message too) and rejoins; puts work again.
    await h.join(0)
    again = h.put()
    h.report(0)
    await settle()
    assert again.code == c.OK


@scenario(timeout_ms=400, on_loss="degrade")
async def test_degrade_acks_with_the_master_alone_after_publishing(h: Harness) -> None:
    await h.join(0)
    waiting = h.put()
    h.now += 0.5
    await settle(0.25)
    assert waiting.code == c.OK
    assert h.events.index(("published", [])) < h.events.index(("acked", waiting.end))
    alone = h.put()
    assert alone.code == c.OK, "degraded: acked at once (after the master's own flush)"
    assert h.sync.committed(*T0) == h.flushed[T0]
    assert ("sync_state", "degraded") in h.sync.status_pairs()


@scenario()
async def test_slave_disconnected_removes_promptly(h: Harness) -> None:
    await h.join(0)
    waiting = h.put()
    h.sync.slave_disconnected(0)  # no clock advance: no timeout involved
    await settle()
    assert h.zk_set == frozenset()
    assert waiting.code == c.GATEWAY_TIMEOUT


@scenario(timeout_ms=400)
async def test_failing_publish_keeps_old_set_and_retries(h: Harness) -> None:
    await h.join(0)
    waiting = h.put()
    h.fail_publishes = 2
    h.sync.slave_disconnected(0)
    await settle(0.1)
    assert h.sync.members == {0} and waiting.code is None, "ZK not written: acks keep waiting on the old set"
    assert h.sync.refusal() is None
    await settle(0.5)  # the publisher retries every 0.2 s
    assert [e for e in h.events if e[0] == "publish-failed"] == [("publish-failed", [])] * 2
    assert h.zk_set == frozenset() and h.sync.members == frozenset()
    assert waiting.code == c.GATEWAY_TIMEOUT


# --- committed --------------------------------------------------------------------------------


@scenario(timeout_ms=400, on_loss="degrade")
async def test_committed_never_decreases(h: Harness) -> None:
    seen = []

    def note() -> None:
        seen.append(h.sync.committed(*T0))

    await h.join(0)
    note()
    h.put(100)
    h.report(0)
    await settle()
    note()
    h.put(100)
    h.put(100)
    note()
    h.report(1, 100)  # joins at committed (100) with a log end of 300
    await settle()
    note()
    h.report(0)
    await settle()
    note()
    h.now += 0.5  # both lose their place; degrade: committed becomes the flushed end...
    h.flushed[T0] = 50  # ...which a fake store reports lower than before: must not go back
    await settle(0.25)
    note()
    assert seen == sorted(seen), seen
    assert seen[-1] >= 100
    assert h.committed_events > 0


@scenario()
async def test_committed_is_what_every_counted_slave_has(h: Harness) -> None:
    await h.join(0, 1)
    h.put(100)
    h.put(100)
    h.report(0, 200)
    h.report(1, 100)
    await settle()
    assert h.sync.committed(*T0) == 100
    h.report(1, 200)
    assert h.sync.committed(*T0) == 200


@scenario()
async def test_committed_stops_at_the_start_of_a_batch_a_slave_holds_only_in_part(h: Harness) -> None:
    """A slave's fetch (or a piece of a large reply) ends inside a batch: readers stop before
    the batch, the plain put before it is acked, and the batch is acked and readable once whole."""
    await h.join(0)
    plain = h.put(100)
    batch = h.put(300, batch=True)  # [100, 400)
    h.report(0, 250)
    await settle()
    assert plain.code == c.OK and batch.code is None
    assert h.sync.committed(*T0) == 100
    h.report(0, 399)
    assert h.sync.committed(*T0) == 100
    h.report(0, 400)
    await settle()
    assert batch.code == c.OK and h.sync.committed(*T0) == 400


@scenario()
async def test_a_slave_joins_at_what_is_acked_even_when_committed_is_held_at_a_batch_start(h: Harness) -> None:
    """The join bar is what no failover can take back, not the (lower) readers' bound."""
    await h.join(0)
    h.put(100, batch=True)
    h.put(100, batch=True)  # [100, 200)
    h.report(0, 150)
    assert h.sync.committed(*T0) == 100
    h.report(1, 120)  # below what slave 0 has: would lack bytes a failover keeps
    await settle()
    assert 1 not in h.sync.counted
    h.report(1, 150)
    await settle()
    assert 1 in h.sync.members


@scenario()
async def test_stop_ends_waiting_puts_with_504(h: Harness) -> None:
    await h.join(0)
    waiting = h.put()
    await h.sync.stop()
    await settle()
    assert waiting.code == c.GATEWAY_TIMEOUT


# --- property: no ack beyond a published slave's position ---------------------------------------

SLAVES = (0, 1, 2)
KEYS = (T0, T1)

step = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(1, 300), st.booleans()),
    st.tuples(st.just("fetch"), st.sampled_from(SLAVES), st.sampled_from(KEYS), st.floats(0, 1)),
    st.tuples(st.just("disconnect"), st.sampled_from(SLAVES)),
    st.tuples(st.just("advance"), st.floats(0, 0.02)),
    st.tuples(st.just("tick"),),
    st.tuples(st.just("zk"), st.sampled_from(["ok", "fail", "slow"])),
    st.tuples(st.just("flush"), st.sampled_from(KEYS)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    min_sync=st.integers(0, 2),
    on_loss=st.sampled_from(["reject", "degrade"]),
    flush_at_once=st.booleans(),
    steps=st.lists(step, max_size=40),
)
def test_property_no_ack_beyond_a_published_slaves_position(
    min_sync: int, on_loss: str, flush_at_once: bool, steps: list
) -> None:
    """Random puts (plain, or batches), fetches that stop anywhere, disconnects, clock jumps and
    ZK failures: whenever a put is acked every slave then named in ZooKeeper has reported at
    least its end, whenever a set is published every slave in it holds every acked put,
    committed never decreases, nobody named in ZooKeeper lacks anything below committed, and
    committed is what no failover can take back moved down to a batch boundary (unchanged
    when no batch contains it) while no put waits for bytes every counted slave has."""

    async def body() -> None:
        h = Harness(min_sync=min_sync, timeout_ms=8, on_loss=on_loss, partitions=KEYS, flush_at_once=flush_at_once)
        have: dict[tuple[int, tuple[str, int]], int] = {}  # what each slave holds (never shrinks)
        acked: list[Put] = []
        waiting: list[Put] = []
        last_committed = {key: 0 for key in KEYS}

        def holds(slave: int, key: tuple[str, int]) -> int:
            return have.get((slave, key), 0)

        original_acked = h._acked

        # Checks inside callbacks record (an exception in publish would look like a ZK error).
        violations: list[tuple[Any, ...]] = []

        def checked_ack(put: Put) -> None:
            for slave in h.zk_set:
                if holds(slave, put.key) < put.end:
                    violations.append(("acked beyond a published slave", slave, put, sorted(h.zk_set)))
            acked.append(put)
            original_acked(put)

        h._acked = checked_ack  # type: ignore[method-assign]
        original_publish = h._publish

        async def checked_publish(members: frozenset[int]) -> None:
            await original_publish(members)
            for put in acked:
                for slave in members:
                    if holds(slave, put.key) < put.end:
                        violations.append(("published a slave lacking an acked put", slave, put, sorted(members)))

        h.sync._publish = checked_publish
        await h.sync.start()
        try:
            for s in steps:
                kind = s[0]
                if kind == "put":
                    waiting.append(h.put(s[2], s[1], batch=s[3]))
                elif kind == "fetch":
                    _, slave, key, frac = s
                    # Report what it holds, then receive part of what the master has beyond it.
                    h.report(slave, holds(slave, key), key)
                    current = holds(slave, key)
                    have[(slave, key)] = current + int((h.ends[key] - current) * frac)
                elif kind == "disconnect":
                    h.sync.slave_disconnected(s[1])
                elif kind == "advance":
                    h.now += s[1]
                elif kind == "tick":
                    await asyncio.sleep(0.003)
                elif kind == "zk":
                    h.fail_publishes = 1 if s[1] == "fail" else 0
                elif kind == "flush":
                    h.flushed[s[1]] = h.ends[s[1]]
                await settle()
                assert not violations, (violations, h.events)
                for key in KEYS:
                    committed = h.sync.committed(*key)
                    assert committed >= last_committed[key]
                    last_committed[key] = committed
                    assert committed <= h.ends[key]
                    for slave in h.zk_set:
                        assert holds(slave, key) >= committed, (slave, key, committed, h.events)
                    # Readers' bound: what no failover takes back, moved down to a batch boundary
                    # (the same offset when no batch contains it), never inside a batch.
                    safe, batches = h.sync._safe_end(*key), h.batches[key]
                    assert committed == batches.boundary_at_or_below(safe), (committed, safe, h.events)
                    assert not any(s_ < committed < e for s_, e in zip(batches._starts, batches._ends))
                    # Acks do not wait for batch boundaries: no put waits for bytes every counted slave has.
                    replicated = h.sync._replicated_end(*key)
                    assert all(p.end > replicated for p in waiting if p.code is None and p.key == key and p.appended)
        finally:
            await h.sync.stop()

    asyncio.run(body())


def test_sync_wait_failed_carries_its_code() -> None:
    exc = SyncWaitFailed(c.GATEWAY_TIMEOUT, "unknown")
    assert exc.code == 504 and exc.message == "unknown" and str(exc) == "unknown"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))


def test_a_promoted_master_acks_nothing_until_its_sync_set_is_published() -> None:
    """The empty set's publish blocks, then fails: no put is acked meanwhile, nor after."""

    async def body() -> None:
        h = Harness(on_loss="degrade", min_sync=1)
        h.gate, h.fail_publishes = asyncio.Event(), 1
        starting = asyncio.ensure_future(h.sync.start())
        await settle()
        assert h.events == [("publish-start", [])]
        put = h.put()  # degrade mode, nobody counted: without the rule this is acked by the master alone
        assert put.code == c.SERVICE_UNAVAILABLE and not put.appended and "not yet published" in put.message
        h.gate.set()
        with pytest.raises(ConnectionError):
            await starting
        assert h.put().code == c.SERVICE_UNAVAILABLE  # ZooKeeper still names the old term's set
        assert not any(event[0] == "acked" for event in h.events)
        await h.sync.stop()
        other = Harness(on_loss="degrade", min_sync=1)
        await other.sync.start()
        assert other.put().code == c.OK  # once published, degrade acks as before
        await other.sync.stop()

    asyncio.run(body())


@scenario()
async def test_consumers_are_woken_for_a_commit_a_reader_moved_before_the_slave_report_was_noted(h: Harness) -> None:
    """A reader's ``committed()`` (a consumer's fetch, stats, a heartbeat) may be what moves
    the committed offset, between a slave's position being recorded and the report being
    noted: the report must still wake the consumers' parked fetches."""
    await h.join(0)
    h.put(100)
    woken = h.committed_events
    h.progress.fetched(0, T0[0], T0[1], 100, EPOCH)  # the slave's position is recorded...
    assert h.sync.committed(*T0) == 100  # ...a reader computes committed: it moves here...
    h.sync.slave_position(0, *T0)  # ...and then the report is noted
    assert h.committed_events == woken + 1
    h.sync.slave_position(0, *T0)  # nothing new: nobody woken again
    assert h.committed_events == woken + 1
