"""The broker's transaction service (metaq/server/transactions.py) over real logs and a real journal.

The broker around it is a small fake (role, durability wait, ACLs); the partition logs,
the per-partition states rebuilt from them, the coordinator and the journal are real.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from metaq.protocol import commands as c
from metaq.protocol.messages import TransactionRequest
from metaq.record import encode_record, iter_records
from metaq.protocol.messages import Operation
from metaq.security.acl import Authorizer, UserAcl
from metaq.security.principal_tags import PrincipalTags
from metaq.security.principals import Principal
from metaq.security.producer_tokens import ProducerTokens
from metaq.server.authz import Authz, ProducerClaim, RequestContext, required_access
from metaq.server.partitions import Appended
from metaq.server.producer_ids import ProducerIdAllocator, local_blocks
from metaq.server.transactional_ids import MAX_EPOCH, LocalMapping, Owner, TransactionalIds
from metaq.server.transactions import TransactionService, aborted_spans, stable_end
from metaq.store.log import PartitionLog
from metaq.txn import control
from metaq.txn.config import FlushTxLog, TxnSettings
from metaq.txn.reader import committed_records
from metaq.txn.txlog import TxLog
from metaq.txn.rebuild import PartitionTxnState
from metaq.txn.xa import Code, State

TOPICS = ("orders", "payments")


def in_loop(test: Any) -> Any:
    """Run an async test in a fresh event loop (fixtures still come by name)."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(test(*args, **kwargs))
    return run


class FakeHa:
    def __init__(self) -> None:
        self.acting_master = True
        self.epoch = 1
        self.refusing: tuple[int, str] | None = None

    def write_refusal(self) -> tuple[int, str] | None:
        return self.refusing


class FakePartition:
    """A partition's append path over the test's log (which the test may also append to directly)."""

    def __init__(self, store: "Store", topic: str) -> None:
        self.store, self.topic = store, topic

    def append_as_leader(self, data: bytearray, records: int, header: object = None) -> Appended:
        offset = self.store.get_log(self.topic, 0).append(data)
        return Appended(offset, offset + len(data), 0)


class States:
    """The registry's API over real logs: ``state`` catches the state up to the log end (the
    tests append to the logs directly too, as a put would)."""

    def __init__(self, store: "Store") -> None:
        self.store = store
        self.states: dict[tuple[str, int], PartitionTxnState] = {}

    def serves(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self.store.logs

    def get(self, topic: str, partition: int) -> FakePartition:
        return FakePartition(self.store, topic)

    def state(self, topic: str, partition: int) -> PartitionTxnState:
        log = self.store.get_log(topic, partition)
        state = self.states.setdefault((topic, partition), PartitionTxnState())
        state.catch_up(log.read, log.log_end)
        return state

    def all(self) -> dict[tuple[str, int], PartitionTxnState]:
        return {key: self.state(*key) for key in self.store.logs}


class Store:
    def __init__(self, base: Path) -> None:
        self.logs = {(t, 0): PartitionLog(base / f"{t}-0", max_segment_size=1 << 20) for t in TOPICS}

    def get_log(self, topic: str, partition: int) -> PartitionLog:
        return self.logs[(topic, partition)]


@dataclass
class FakeBroker:
    base: Path
    settings: TxnSettings = field(default_factory=TxnSettings)
    authorizer: Authorizer | None = None
    tokens: ProducerTokens | None = None
    waits: list[asyncio.Future[None]] = field(default_factory=list)
    hold_acks: bool = False

    def __post_init__(self) -> None:
        self.config = type("Config", (), {"txn": self.settings, "data_path": str(self.base)})()
        tags = PrincipalTags(b"t" * 32) if self.authorizer is not None else None
        self.security = type("Security", (), {"authorizer": self.authorizer, "producer_tokens": self.tokens,
                                              "principal_tags": tags})()
        self.authz = Authz(self.security)
        self.store = Store(self.base)
        self.partitions = States(self.store)
        self.ha = FakeHa()
        #: None: no transactional ids (``with_names`` gives the broker some).
        self.transactional_ids: TransactionalIds | None = None

    def durability_wait(self, topic: str, partition: int, end: int, count: int) -> Any:
        if not self.hold_acks:
            return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waits.append(future)
        return future

    def put(self, topic: str, txid: str, data: bytes, seq: int = 0) -> None:
        """What the put path does for a transactional batch (after ``enlist``)."""
        body = encode_record(data)
        framed = control.frame_batch(body, 1, producer_id=7, producer_epoch=0, first_seq=seq, timestamp_ms=1, txid=txid)
        self.store.get_log(topic, 0).append(framed)

    def visible(self, topic: str) -> list[bytes]:
        """What a read-committed consumer gets: up to the LSO, aborted spans and control records skipped."""
        log = self.store.get_log(topic, 0)
        upto = stable_end(self.partitions, topic, 0, log.log_end)
        buf = log.read(0, upto, upto)
        spans = aborted_spans(self.partitions, topic, 0, 0, upto)
        return [r.data for r in committed_records(buf, 0, spans).records]


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll: the journal's fsync runs in a worker thread, so markers land a moment after the step."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.002)


async def journaled(service: TransactionService) -> None:
    """Markers nobody waits on (timeouts, reconcile) are appended once their decisions are fsynced
    in a worker thread: wait for that fsync, then let the appending task run."""
    await service._journal_durable()
    for _ in range(3):
        await asyncio.sleep(0)


def request(action: str, xid: str = "", **fields: Any) -> TransactionRequest:
    return TransactionRequest(action=action, xid=xid, opaque=1, **fields)


@pytest.fixture
def clock() -> list[int]:
    return [1_000_000]


def make(tmp_path: Path, clock: list[int], **kwargs: Any) -> tuple[FakeBroker, TransactionService]:
    broker = FakeBroker(tmp_path, **kwargs)
    service = TransactionService(broker, clock_ms=lambda: clock[0])
    service.open()
    service.on_leading(broker.ha.epoch)  # as the broker's start without ZooKeeper does
    return broker, service


async def call(service: TransactionService, action: str, xid: str = "", principal: Principal | None = None,
               **fields: Any) -> dict[str, Any]:
    ctx = RequestContext(principal, "127.0.0.1:1", ProducerClaim())
    header, _body = await service.serve(request(action, xid, **fields), ctx)
    return header


async def opened(broker: FakeBroker, service: TransactionService, xid: str, data: bytes, topic: str = "orders",
                 **start: Any) -> None:
    """A started branch with one message put in ``topic``."""
    assert (await call(service, "start", xid, **start))["xa_code"] == Code.XA_OK
    service.enlist(xid, topic, 0)
    broker.put(topic, xid, data)


async def commit_in_flight(broker: FakeBroker, service: TransactionService, xid: str) -> "asyncio.Future[dict[str, Any]]":
    """A branch with one message in orders, ended, its commit_one_phase sent (not awaited)."""
    await opened(broker, service, xid, b"one")
    await call(service, "end", xid)
    return asyncio.ensure_future(call(service, "commit_one_phase", xid))


async def branch(broker: FakeBroker, service: TransactionService, xid: str, then: str, topics: tuple[str, ...] = TOPICS,
                 principal: Principal | None = None) -> int:
    """start, one put per topic, end, then ``then`` (prepare, commit_one_phase, rollback); its XA code."""
    assert (await call(service, "start", xid, principal))["xa_code"] == Code.XA_OK
    for topic in topics:
        service.enlist(xid, topic, 0, control.NO_PRODUCER, principal)
        broker.put(topic, xid, f"{xid} {topic}".encode())
    await call(service, "end", xid, principal)
    return (await call(service, then, xid, principal))["xa_code"]


@in_loop
async def test_a_local_transaction_is_invisible_until_commit_and_never_after_rollback(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    await opened(broker, service, "TX:7:1", b"one")
    assert broker.visible("orders") == []
    await call(service, "end", "TX:7:1")
    assert (await call(service, "commit_one_phase", "TX:7:1"))["xa_code"] == Code.XA_OK
    assert broker.visible("orders") == [b"one"]

    assert await branch(broker, service, "TX:7:2", "rollback") == Code.XA_OK
    assert broker.visible("orders") == [b"one"] and broker.visible("payments") == []
    assert await branch(broker, service, "TX:7:3", "commit_one_phase") == Code.XA_OK
    assert broker.visible("payments") == [b"TX:7:3 payments"]


@in_loop
async def test_an_open_transaction_holds_back_later_plain_records(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    await opened(broker, service, "TX:7:1", b"in txn")
    broker.store.get_log("orders", 0).append(encode_record(b"plain, after"))
    assert broker.visible("orders") == []
    await call(service, "end", "TX:7:1")
    await call(service, "rollback", "TX:7:1")
    assert broker.visible("orders") == [b"plain, after"]


@in_loop
async def test_enlist_refuses_work_outside_an_active_branch(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    with pytest.raises(c.RequestError, match="TX:7:9 takes no more messages: XAER_NOTA"):
        service.enlist("TX:7:9", "orders", 0)
    await call(service, "start", "TX:7:9")
    await call(service, "end", "TX:7:9")
    with pytest.raises(c.RequestError, match="XAER_PROTO"):
        service.enlist("TX:7:9", "orders", 0)


@in_loop
async def test_only_a_writable_master_serves_and_a_slave_answers_like_for_puts(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    broker.ha.refusing = (c.FORBIDDEN, "broker 1 slave1 is a slave; writes go to its master")
    with pytest.raises(c.RequestError) as refused:
        service.serve(request("start", "x"), RequestContext(None, "127.0.0.1:1", ProducerClaim()))
    assert refused.value.code == c.FORBIDDEN
    with pytest.raises(c.RequestError):
        service.enlist("x", "orders", 0)


@in_loop
async def test_the_reply_waits_until_the_markers_are_durable_and_a_retry_waits_too(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock, hold_acks=True)
    commit = await commit_in_flight(broker, service, "TX:7:1")
    retry = asyncio.ensure_future(call(service, "commit_one_phase", "TX:7:1"))
    await until(lambda: len(broker.waits) >= 2)
    assert not commit.done() and not retry.done()  # the COMMIT marker is appended, not yet safe
    for wait in broker.waits:
        wait.set_result(None)
    assert (await commit)["xa_code"] == Code.XA_OK
    assert (await retry)["xa_code"] == Code.XA_OK


@in_loop
async def test_a_marker_that_fails_to_replicate_fails_the_reply_and_the_retry_waits_again(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock, hold_acks=True)
    await call(service, "start", "TX:7:1")
    await call(service, "end", "TX:7:1")
    service.coordinator.branches["TX:7:1"].partitions.append(("orders", 0))  # as if it had written there
    commit = asyncio.ensure_future(call(service, "commit_one_phase", "TX:7:1"))
    await until(lambda: len(broker.waits) >= 1)
    broker.waits[0].set_exception(c.RequestError(c.GATEWAY_TIMEOUT, "sync slaves did not confirm in time"))
    with pytest.raises(c.RequestError) as failed:
        await commit
    assert failed.value.code == c.GATEWAY_TIMEOUT
    retry = asyncio.ensure_future(call(service, "commit_one_phase", "TX:7:1"))
    await until(lambda: len(broker.waits) >= 2)
    assert not retry.done() and len(broker.waits) == 2
    broker.waits[1].set_result(None)
    assert (await retry)["xa_code"] == Code.XA_OK


@in_loop
async def test_a_timeout_rolls_the_branch_back_with_abort_markers(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock, settings=TxnSettings(max_tx_timeout_s=5))
    await opened(broker, service, "TX:7:1", b"late", timeout_s=2)
    broker.store.get_log("orders", 0).append(encode_record(b"plain"))
    clock[0] += 2_001
    service.tick()
    await journaled(service)
    assert broker.visible("orders") == [b"plain"]
    assert (await call(service, "end", "TX:7:1"))["xa_code"] == Code.XA_RBROLLBACK


@in_loop
async def test_a_new_master_learns_a_prepared_branch_from_the_log_and_commits_it(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    await opened(broker, service, "TX:7:5", b"never")  # unprepared work of the old master: rolled back
    assert await branch(broker, service, "XID:1:01:02", "prepare") == Code.XA_OK

    # The same logs, a fresh service without the old journal: as a promoted slave has them.
    (tmp_path / "transactions").rename(tmp_path / "old-journal")
    successor = TransactionService(broker, clock_ms=lambda: clock[0])
    successor.open()
    broker.ha.epoch = 2
    assert successor.refusal() is not None  # not leading yet: refusal() only reads, it reconciles nothing
    successor.on_leading(2)  # the coordinator's _lead: reconciled at once (this master may write)
    assert successor.refusal() is None
    assert (await call(successor, "recover"))["xids"] == ["XID:1:01:02"]
    await asyncio.sleep(0)
    assert broker.visible("orders") == [] and broker.visible("payments") == []
    assert (await call(successor, "commit", "XID:1:01:02"))["xa_code"] == Code.XA_OK
    assert broker.visible("orders") == [b"XID:1:01:02 orders"]
    assert broker.visible("payments") == [b"XID:1:01:02 payments"]
    assert (await call(successor, "end", "TX:7:5"))["xa_code"] == Code.XA_RBROLLBACK


@in_loop
async def test_a_restart_keeps_a_prepared_branch(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    assert await branch(broker, service, "XID:1:aa:bb", "prepare", ("orders",)) == Code.XA_OK
    await service.stop()

    restarted = FakeBroker(tmp_path)  # the same directories: logs and journal reopened
    again = TransactionService(restarted, clock_ms=lambda: clock[0])
    again.open()
    again.on_leading(restarted.ha.epoch)
    assert (await call(again, "recover"))["xids"] == ["XID:1:aa:bb"]
    assert (await call(again, "rollback", "XID:1:aa:bb"))["xa_code"] == Code.XA_OK
    assert restarted.visible("orders") == []


@in_loop
async def test_deciding_a_branch_needs_the_user_that_started_it_or_admin(tmp_path: Path, clock: list[int]) -> None:
    authorizer = Authorizer(1, {"app": UserAcl(produce=("orders",)), "other": UserAcl(produce=("orders",)),
                                "ops": UserAcl(admin=True)})
    broker, service = make(tmp_path, clock, authorizer=authorizer)
    app, other, ops = Principal("app"), Principal("other"), Principal("ops")
    assert await branch(broker, service, "TX:7:1", "prepare", ("orders",), app) == Code.XA_OK
    # The connection lets any authenticated principal reach the coordinator; the coordinator decides.
    assert required_access({"op": "transaction", "action": "commit", "xid": "TX:7:1"}) == (Operation.DESCRIBE, None)
    # produce on the branch's topics is not enough: the branch is app's
    with pytest.raises(c.RequestError, match="user 'other' may not decide transaction TX:7:1: only the user that started"):
        await call(service, "commit", "TX:7:1", other)
    assert (await call(service, "recover", principal=other))["xids"] == []
    assert (await call(service, "recover", principal=app))["xids"] == ["TX:7:1"]
    assert (await call(service, "commit", "TX:7:1", ops))["xa_code"] == Code.XA_OK

    # An empty branch (no topic yet) is its starter's too.
    assert (await call(service, "start", "TX:7:2", app))["xa_code"] == Code.XA_OK
    for action in ("end", "rollback"):
        with pytest.raises(c.RequestError, match="may not decide transaction TX:7:2") as refused:
            await call(service, action, "TX:7:2", other)
        assert refused.value.code == c.FORBIDDEN
    assert (await call(service, "end", "TX:7:2", app))["xa_code"] == Code.XA_OK


@in_loop
async def test_the_starter_survives_a_restart_and_a_take_over_and_an_unknown_one_is_admin_only(
        tmp_path: Path, clock: list[int]) -> None:
    authorizer = Authorizer(1, {"app": UserAcl(produce=("orders",)), "other": UserAcl(produce=("orders",)),
                                "ops": UserAcl(admin=True)})
    app, other, ops = Principal("app"), Principal("other"), Principal("ops")
    # Prepared with security off: its PREPARE has no starter (the layout of markers older than starters).
    insecure, service = make(tmp_path, clock)
    assert await branch(insecure, service, "XID:1:01:03", "prepare", ("orders",), app) == Code.XA_OK
    await service.stop()
    broker, service = make(tmp_path, clock, authorizer=authorizer)
    for xid in ("XID:1:01:01", "XID:1:01:02"):
        assert await branch(broker, service, xid, "prepare", ("orders",), app) == Code.XA_OK
    tag = broker.security.principal_tags.tag("app")
    prepares = [control.control_of(r) for r in iter_records(broker.store.get_log("orders", 0).read(0, 1 << 20, 1 << 20))
                if control.control_of(r) is not None and control.control_of(r).kind is control.Kind.PREPARE]
    assert [p.starter for p in prepares] == ["", tag, tag], "the PREPARE markers carry the starter's tag, not the name"
    await service.stop()

    restarted = FakeBroker(tmp_path, authorizer=authorizer)  # the journal and the logs reopened
    again = TransactionService(restarted, clock_ms=lambda: clock[0])
    again.open()
    again.on_leading(restarted.ha.epoch)
    assert (await call(again, "recover", principal=other))["xids"] == []
    with pytest.raises(c.RequestError, match="may not decide transaction XID:1:01:01") as refused:
        await call(again, "rollback", "XID:1:01:01", other)
    assert refused.value.code == c.FORBIDDEN
    assert (await call(again, "commit", "XID:1:01:01", app))["xa_code"] == Code.XA_OK
    await again.stop()

    # A take-over: the same logs, no journal (a promoted slave has only the replicated PREPARE markers).
    (tmp_path / "transactions").rename(tmp_path / "old-journal")
    successor = TransactionService(restarted, clock_ms=lambda: clock[0])
    successor.open()
    restarted.ha.epoch = 2
    successor.on_leading(2)
    assert (await call(successor, "recover", principal=other))["xids"] == []
    assert (await call(successor, "recover", principal=app))["xids"] == ["XID:1:01:02"]
    with pytest.raises(c.RequestError, match="may not decide transaction XID:1:01:02"):
        await call(successor, "commit", "XID:1:01:02", other)
    assert (await call(successor, "commit", "XID:1:01:02", app))["xa_code"] == Code.XA_OK

    # The branch whose PREPARE has no starter: admin's alone, not even produce on its topics is enough.
    with pytest.raises(c.RequestError, match="may not decide transaction XID:1:01:03"):
        await call(successor, "commit", "XID:1:01:03", app)
    assert (await call(successor, "recover", principal=ops))["xids"] == ["XID:1:01:03"]
    assert (await call(successor, "commit", "XID:1:01:03", ops))["xa_code"] == Code.XA_OK


@in_loop
async def test_only_the_branchs_producer_or_its_starter_enlists_a_put(tmp_path: Path, clock: list[int]) -> None:
    authorizer = Authorizer(1, {"app": UserAcl(produce=("orders",)), "other": UserAcl(produce=("orders",)),
                                "ops": UserAcl(admin=True)})
    broker, service = make(tmp_path, clock, authorizer=authorizer)
    app, other, ops = Principal("app"), Principal("other"), Principal("ops")
    assert (await call(service, "start", "TX:7:1", app, producer_id=7, producer_epoch=0))["xa_code"] == Code.XA_OK
    with pytest.raises(c.RequestError, match="user 'other' may not put in transaction TX:7:1") as refused:
        service.enlist("TX:7:1", "orders", 0, 8, other)  # its own producer id, verified for it: still not this branch's
    assert refused.value.code == c.FORBIDDEN
    assert service.coordinator is not None and service.coordinator.branches["TX:7:1"].partitions == []
    service.enlist("TX:7:1", "orders", 0, 7, other)  # the branch's producer (its token was verified for the sender)
    service.enlist("TX:7:1", "payments", 0, 9, app)  # the starter, with another producer (an XA join)
    with pytest.raises(c.RequestError, match="user 'ops' may not put in transaction TX:7:1"):
        service.enlist("TX:7:1", "payments", 0, 10, ops)  # admin may decide the branch, not add to it
    # A branch started without a producer id: only its starter (or admin) adds to it.
    assert (await call(service, "start", "TX:7:2", app))["xa_code"] == Code.XA_OK
    with pytest.raises(c.RequestError, match="may not put in transaction TX:7:2"):
        service.enlist("TX:7:2", "orders", 0, control.NO_PRODUCER, other)


@in_loop
async def test_a_start_or_recover_needs_produce_on_some_topic_and_a_start_room_under_the_users_cap(tmp_path: Path, clock: list[int]) -> None:
    authorizer = Authorizer(1, {"app": UserAcl(produce=("orders",)), "other": UserAcl(produce=("orders",)),
                                "reader": UserAcl(consume=("*",))})
    broker, service = make(tmp_path, clock, authorizer=authorizer,
                           settings=TxnSettings(max_open_transactions_per_user=2))
    app, other, reader = Principal("app"), Principal("other"), Principal("reader")
    with pytest.raises(c.RequestError, match="may not start a transaction: user 'reader' may not produce any topic") as no:
        await call(service, "start", "TX:7:0", reader)
    assert no.value.code == c.FORBIDDEN
    assert service.coordinator is not None and service.coordinator.branches == {}
    # recover too: only who could own a branch (or admin, who decides any) may ask for the list.
    with pytest.raises(c.RequestError, match="may not recover transactions: user 'reader' may not produce any topic") as no:
        await call(service, "recover", principal=reader)
    assert no.value.code == c.FORBIDDEN
    for xid in ("TX:7:1", "TX:7:2"):
        assert (await call(service, "start", xid, app))["xa_code"] == Code.XA_OK
    with pytest.raises(c.RequestError, match="user 'app' already holds 2 open transaction branches on this broker "
                                             r"\(maxOpenTransactionsPerUser\)") as full:
        await call(service, "start", "TX:7:3", app)
    assert full.value.code == c.FORBIDDEN and "TX:7:3" not in service.coordinator.branches
    # A retried start of a branch it holds is answered as before (XAER_DUPID), not refused by the cap.
    assert (await call(service, "start", "TX:7:2", app))["xa_code"] == Code.XAER_DUPID
    assert (await call(service, "start", "TX:8:1", other))["xa_code"] == Code.XA_OK  # the cap is per user
    await call(service, "end", "TX:7:1", app)
    await call(service, "rollback", "TX:7:1", app)
    assert (await call(service, "start", "TX:7:3", app))["xa_code"] == Code.XA_OK  # room again


@in_loop
async def test_a_step_with_a_producer_id_needs_its_token(tmp_path: Path, clock: list[int]) -> None:
    tokens = ProducerTokens(b"k" * 32)
    broker, service = make(tmp_path, clock, tokens=tokens)
    app, other = Principal("app"), Principal("other")
    with pytest.raises(c.RequestError, match="producer id 7 not issued to app") as refused:
        await call(service, "start", "TX:7:1", app, producer_id=7, producer_epoch=0)
    assert refused.value.code == c.FORBIDDEN
    assert service.coordinator is not None and "TX:7:1" not in service.coordinator.branches
    token = tokens.issue(7, 0, "app")
    with pytest.raises(c.RequestError, match="producer id 7 not issued to other"):
        await call(service, "start", "TX:7:1", other, producer_id=7, producer_epoch=0, producer_token=token)
    assert (await call(service, "start", "TX:7:1", app, producer_id=7, producer_epoch=0,
                       producer_token=token))["xa_code"] == Code.XA_OK


def test_bad_transaction_requests_get_one_line_errors() -> None:
    from metaq.protocol.frames import Frame
    from metaq.protocol.messages import parse_request

    with pytest.raises(c.RequestError, match="action 'begin' is not one of start, "):
        parse_request(Frame({"op": "transaction", "opaque": 1, "action": "begin", "xid": "x"}, b""))
    with pytest.raises(c.RequestError, match="action 'commit' needs an 'xid'"):
        parse_request(Frame({"op": "transaction", "opaque": 1, "action": "commit"}, b""))
    assert parse_request(Frame({"op": "transaction", "opaque": 1, "action": "recover"}, b"")).action == "recover"


def test_markers_in_the_log_are_ordinary_records_readers_skip(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, max_segment_size=1 << 20)
    log.append(control.marker(control.Kind.COMMIT, "TX:1:1", producer_id=1, producer_epoch=0, timestamp_ms=1))
    records = list(iter_records(log.read(0, log.log_end), 0))
    assert len(records) == 1 and records[0].attribute == control.CONTROL_ATTRIBUTE


def with_names(broker: FakeBroker) -> TransactionalIds:
    """The broker's transactional ids over a local mapping (after ``make``: its reconcile read none)."""
    names = TransactionalIds(ProducerIdAllocator(1, local_blocks(broker.base)), LocalMapping(broker.base))
    broker.transactional_ids = names
    return names


async def init_after(broker: FakeBroker, service: TransactionService, name: str, previous: Owner) -> Owner:
    """``init_producer`` of ``name`` whose mapping held ``previous``: the owner raises the fence, the
    service rolls the zombies back (what ``RequestHandlers._init_transactional`` does)."""
    names = broker.transactional_ids or with_names(broker)
    names.store.write(name, previous, None)
    owner, replaced = await names.init(name)
    assert replaced == previous
    await service.fence(name, owner, replaced)
    return owner


@in_loop
async def test_an_init_of_a_newer_instance_rolls_back_the_zombies_open_branch_and_refuses_its_steps(
        tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    await opened(broker, service, "TX:7:1", b"zombie's", producer_id=7, producer_epoch=0)
    await opened(broker, service, "XA:prepared", b"prepared", topic="payments", producer_id=7, producer_epoch=0)
    await call(service, "end", "XA:prepared")
    assert (await call(service, "prepare", "XA:prepared"))["xa_code"] == Code.XA_OK
    await opened(broker, service, "TX:8:1", b"another producer's", producer_id=8, producer_epoch=0)

    assert await init_after(broker, service, "app", Owner(7, 0)) == Owner(7, 1)
    assert service.coordinator is not None
    assert service.coordinator.state_of("TX:7:1") is State.ROLLED_BACK  # its ABORT marker is in the log
    assert service.coordinator.state_of("XA:prepared") is State.PREPARED  # left to its transaction manager
    assert service.coordinator.state_of("TX:8:1") is State.ACTIVE
    with pytest.raises(c.RequestError, match="fenced: a newer instance of transactional id app exists") as refused:
        await call(service, "end", "TX:7:1", producer_id=7, producer_epoch=0)
    assert refused.value.code == c.FORBIDDEN
    with pytest.raises(c.RequestError, match="fenced"):
        service.check_fenced(7, 0)  # the put path's check
    service.check_fenced(7, 1)
    service.check_fenced(8, 0)
    await call(service, "end", "TX:8:1")
    await call(service, "commit_one_phase", "TX:8:1")
    assert broker.visible("orders") == [b"another producer's"]


@in_loop
async def test_an_overflowed_name_fences_every_epoch_of_its_old_producer_id(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    await opened(broker, service, "TX:7:1", b"zombie's", producer_id=7, producer_epoch=MAX_EPOCH)
    owner = await init_after(broker, service, "app", Owner(7, MAX_EPOCH))
    assert owner.producer_id != 7 and owner.epoch == 0
    assert service.coordinator is not None and service.coordinator.state_of("TX:7:1") is State.ROLLED_BACK
    with pytest.raises(c.RequestError, match="fenced"):
        service.check_fenced(7, MAX_EPOCH)
    assert broker.visible("orders") == []


@in_loop
async def test_the_newest_epoch_of_a_transactional_id_has_one_owner_and_one_writer(tmp_path: Path, clock: list[int]) -> None:
    """Regression: the service kept its own fences, merged from the init, the mapping and the
    logs' BATCH records. Now ``TransactionalIds`` alone holds and writes them; the service reads."""
    broker, service = make(tmp_path, clock)
    names = with_names(broker)
    owner, _ = await names.init("app")
    fence = service.fence_of(owner.producer_id)  # before the service heard of the init: nothing to copy
    assert fence is not None and fence.epoch == owner.epoch and fence is names.fence_of(owner.producer_id)
    again, _ = await names.init("app")
    assert service.fence_of(owner.producer_id) == (again.epoch, "app")
    # No second table of producer ids anywhere in the service (a copy would go stale).
    assert not [name for name, value in vars(service).items() if isinstance(value, dict) and owner.producer_id in value]


@in_loop
async def test_a_new_master_fences_from_the_groups_mapping_and_a_partitions_table_holds_only_its_appends(
        tmp_path: Path, clock: list[int]) -> None:
    broker = FakeBroker(tmp_path)
    log = broker.store.get_log("orders", 0)
    log.append(control.frame_batch(encode_record(b"newer instance"), 1, producer_id=7, producer_epoch=3, first_seq=0,
                                   timestamp_ms=1, txid="TX:7:9"))
    log.append(control.frame_batch(encode_record(b"no name"), 1, producer_id=8, producer_epoch=2, first_seq=0,
                                   timestamp_ms=1))
    names = with_names(broker)
    names.store.write("app", Owner(7, 3), None)  # written by the old master's init
    promoted = TransactionService(broker, clock_ms=lambda: clock[0])  # a slave taking over
    promoted.open()
    promoted.on_leading(1)
    assert promoted.refusal() is not None  # transaction steps wait for the mapping
    await until(lambda: promoted.refusal() is None)
    with pytest.raises(c.RequestError, match="epoch 2, current epoch 3"):
        promoted.check_fenced(7, 2)
    promoted.check_fenced(7, 3)
    # Producer 8 has no transactional id: its partition's table judges its puts there (plan_put),
    # and no epoch of it is fenced across partitions from the logs.
    assert promoted.fence_of(8) is None
    promoted.check_fenced(8, 1)
    await promoted.stop()


class FailingAppends:
    """Wraps a partition log: its next ``failures`` appends raise OSError (a full disk)."""

    def __init__(self, log: PartitionLog, failures: int = 1) -> None:
        self.log, self.failures = log, failures

    def append(self, data: Any) -> int:
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        return self.log.append(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.log, name)


def fail_appends(broker: FakeBroker, topic: str, failures: int = 1) -> None:
    broker.store.logs[(topic, 0)] = FailingAppends(broker.store.logs[(topic, 0)], failures)  # type: ignore[assignment]


def markers_in(broker: FakeBroker, topic: str, kind: control.Kind) -> int:
    log = broker.store.get_log(topic, 0)
    controls = (control.control_of(r) for r in iter_records(log.read(0, log.log_end, log.log_end), 0))
    return sum(1 for found in controls if found is not None and found.kind is kind)


@in_loop
async def test_a_failed_second_marker_stays_pending_and_the_retry_writes_it_once(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock)
    assert (await call(service, "start", "TX:7:1"))["xa_code"] == Code.XA_OK
    for topic in TOPICS:
        service.enlist("TX:7:1", topic, 0)
        broker.put(topic, "TX:7:1", f"one {topic}".encode())
    await call(service, "end", "TX:7:1")
    fail_appends(broker, "payments")
    with pytest.raises(c.RequestError) as failed:
        await call(service, "commit_one_phase", "TX:7:1")
    assert failed.value.code == c.SERVICE_UNAVAILABLE and "No space left" in failed.value.message
    assert broker.visible("orders") == [b"one orders"] and broker.visible("payments") == []  # decided, one marker owed
    assert (await call(service, "commit_one_phase", "TX:7:1"))["xa_code"] == Code.XA_OK  # the retry writes it
    assert broker.visible("payments") == [b"one payments"]
    assert markers_in(broker, "orders", control.Kind.COMMIT) == 1 and markers_in(broker, "payments", control.Kind.COMMIT) == 1


async def commit_that_fails_to_append(tmp_path: Path, clock: list[int]) -> tuple[FakeBroker, TransactionService]:
    """TX:7:1 with one message in orders, ended; its commit_one_phase failed to append the COMMIT marker."""
    broker, service = make(tmp_path, clock)
    await opened(broker, service, "TX:7:1", b"one")
    await call(service, "end", "TX:7:1")
    fail_appends(broker, "orders")
    with pytest.raises(c.RequestError):
        await call(service, "commit_one_phase", "TX:7:1")
    return broker, service


@in_loop
async def test_the_tick_appends_a_marker_an_earlier_failure_left_pending(tmp_path: Path, clock: list[int]) -> None:
    broker, service = await commit_that_fails_to_append(tmp_path, clock)
    with pytest.raises(c.RequestError, match="TX:7:1 is being decided"):
        service.enlist("TX:7:1", "orders", 0)
    service.tick()
    await journaled(service)
    assert broker.visible("orders") == [b"one"]
    service.tick()  # nothing left to write
    assert markers_in(broker, "orders", control.Kind.COMMIT) == 1


@in_loop
async def test_an_epoch_that_does_not_fit_a_marker_is_refused_and_changes_nothing(tmp_path: Path, clock: list[int]) -> None:
    from metaq.protocol.frames import Frame
    from metaq.protocol.messages import parse_request

    for field_name, value in (("producer_epoch", 40_000), ("producer_id", 1 << 63), ("producer_id", -2)):
        with pytest.raises(c.RequestError) as refused:
            parse_request(Frame({"op": "transaction", "opaque": 1, "action": "start", "xid": "x", field_name: value}, b""))
        assert refused.value.code == c.BAD_REQUEST and "out of range" in refused.value.message
    with pytest.raises(c.RequestError, match="timeout_s -1 out of range"):
        parse_request(Frame({"op": "transaction", "opaque": 1, "action": "start", "xid": "x", "timeout_s": -1}, b""))
    # Past the request check (a branch journaled by an older broker): the step is refused before any change.
    broker, service = make(tmp_path, clock)
    await opened(broker, service, "TX:7:1", b"one")
    await call(service, "end", "TX:7:1")
    service.coordinator.branches["TX:7:1"].producer_epoch = 40_000
    with pytest.raises(c.RequestError) as refused:
        await call(service, "commit_one_phase", "TX:7:1")
    assert refused.value.code == c.BAD_REQUEST and "cannot be encoded" in refused.value.message
    assert service.coordinator.branches["TX:7:1"].state is State.IDLE and markers_in(broker, "orders", control.Kind.COMMIT) == 0


@in_loop
async def test_a_tick_whose_first_timed_out_branch_fails_to_append_still_aborts_the_second(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock, settings=TxnSettings(max_tx_timeout_s=5))
    await opened(broker, service, "TX:7:1", b"late one", topic="orders", timeout_s=2)
    await opened(broker, service, "TX:7:2", b"late two", topic="payments", timeout_s=2)
    broker.store.get_log("orders", 0).append(encode_record(b"plain one"))
    broker.store.get_log("payments", 0).append(encode_record(b"plain two"))
    fail_appends(broker, "orders")
    clock[0] += 2_001
    service.tick()
    await journaled(service)
    assert broker.visible("payments") == [b"plain two"]  # the second branch's ABORT is written
    assert broker.visible("orders") == []  # the first's is owed: its open records still hold the LSO
    service.tick()
    await journaled(service)
    assert broker.visible("orders") == [b"plain one"]
    assert markers_in(broker, "orders", control.Kind.ABORT) == 1


@in_loop
async def test_a_new_epoch_forgets_the_marker_ends_of_the_previous_mastership(tmp_path: Path, clock: list[int]) -> None:
    broker, service = make(tmp_path, clock, hold_acks=True)
    commit = await commit_in_flight(broker, service, "TX:7:1")
    await until(lambda: "TX:7:1" in service._unsettled)
    assert "TX:7:1" in service._unsettled  # its marker's end: it may be truncated away as a slave
    commit.cancel()
    service.on_resigned()  # slave, then master again in a new epoch
    broker.ha.epoch = 2
    broker.hold_acks = False
    service.on_leading(2)
    assert service.refusal() is None
    assert service._unsettled == {} and service._background == set()
    assert (await call(service, "commit_one_phase", "TX:7:1"))["xa_code"] == Code.XA_OK  # no wait on the old end


@in_loop
async def test_a_new_epoch_drops_queued_markers_and_the_logs_decide(tmp_path: Path, clock: list[int]) -> None:
    broker, service = await commit_that_fails_to_append(tmp_path, clock)  # never answered XA_OK: outcome unknown
    service.on_resigned()
    broker.ha.epoch = 2
    service.on_leading(2)
    assert service.refusal() is None
    await journaled(service)
    assert service._pending == {}
    assert broker.visible("orders") == []  # no COMMIT landed: rolled back, as on any other new master
    assert markers_in(broker, "orders", control.Kind.COMMIT) == 0 and markers_in(broker, "orders", control.Kind.ABORT) == 1
    assert (await call(service, "commit_one_phase", "TX:7:1"))["xa_code"] != Code.XA_OK


@in_loop
async def test_refusal_is_a_pure_read_and_the_reconcile_waits_for_a_writable_master(tmp_path: Path, clock: list[int]) -> None:
    """on_leading while writes are still refused (a sync master before its set is published):
    refusal() answers 503 without reconciling, however often asked; the tick reconciles once
    writable; on_resigned refuses again."""
    broker, service = make(tmp_path, clock)
    await opened(broker, service, "TX:7:1", b"old master's")  # unprepared: a new epoch rolls it back
    service.on_resigned()
    broker.ha.epoch = 2
    broker.ha.refusing = (c.SERVICE_UNAVAILABLE, "sync set not yet published")
    service.on_leading(2)
    for _ in range(3):
        assert service.refusal() == broker.ha.refusing
    broker.ha.refusing = None
    for _ in range(3):
        assert service.refusal() is not None and service.reconciled_epoch == 1  # asking reconciles nothing
    service.tick()
    assert service.reconciled_epoch == 2 and service.refusal() is None
    await journaled(service)
    assert markers_in(broker, "orders", control.Kind.ABORT) == 1
    service.on_resigned()
    assert service.refusal() is not None


@in_loop
async def test_a_decision_is_fsynced_off_the_event_loop_before_its_markers_and_answer(tmp_path: Path, clock: list[int]) -> None:
    """flushTxLogAtCommit=1: the commit's journal fsync runs in a worker thread, and no COMMIT
    marker is in the log before it returns."""
    broker, service = make(tmp_path, clock)
    loop_thread = threading.get_ident()
    fsyncs: list[tuple[int, int]] = []  # (thread, COMMIT markers in the log at the fsync)
    assert service.journal is not None
    real_fsync = service.journal._fsync

    def recording_fsync(fd: int) -> None:
        fsyncs.append((threading.get_ident(), markers_in(broker, "orders", control.Kind.COMMIT)))
        real_fsync(fd)

    service.journal._fsync = recording_fsync
    await opened(broker, service, "TX:7:1", b"one")
    await call(service, "end", "TX:7:1")
    assert (await call(service, "commit_one_phase", "TX:7:1"))["xa_code"] == Code.XA_OK
    assert fsyncs and all(thread != loop_thread for thread, _ in fsyncs)
    assert fsyncs[-1][1] == 0 and markers_in(broker, "orders", control.Kind.COMMIT) == 1


@in_loop
async def test_the_mode_2_fsync_and_the_checkpoint_run_off_the_event_loop(tmp_path: Path, clock: list[int]) -> None:
    """flushTxLogAtCommit=2: the once-a-second fsync and the periodic checkpoint are started by the
    tick and run in a worker thread; every fsync of the journal (redo files, checkpoint, directory)
    is off the loop, and a branch journaled meanwhile survives a reopen."""
    settings = TxnSettings(flush_tx_log_at_commit=FlushTxLog.EVERY_SECOND, checkpoint_interval_ms=5000)
    broker, service = make(tmp_path, clock, settings=settings)
    journal = service.journal
    assert journal is not None
    loop_thread = threading.get_ident()
    fsync_threads: list[int] = []
    real_fsync = journal._fsync

    def recording_fsync(fd: int) -> None:
        fsync_threads.append(threading.get_ident())
        real_fsync(fd)

    journal._fsync = recording_fsync
    assert (await call(service, "start", "TX:7:1"))["xa_code"] == Code.XA_OK
    clock[0] += 1500  # a second after the write: the mode-2 fsync is due
    service.tick()
    assert service._upkeep is not None
    await until(lambda: bool(fsync_threads) and service._upkeep is not None and service._upkeep.done())
    assert journal._dirty_since_ms is None
    clock[0] += 5000  # the checkpoint is due
    service.tick()
    assert (await call(service, "start", "TX:7:2"))["xa_code"] == Code.XA_OK  # while it runs
    await until(lambda: service._upkeep is not None and service._upkeep.done())
    assert any(p.name.startswith("checkpoint.") for p in journal.directory.iterdir())
    assert fsync_threads and loop_thread not in fsync_threads
    await service.stop()
    again = TxLog.open(tmp_path, settings, clock[0])
    assert {"TX:7:1", "TX:7:2"} <= set(again.branches)
    again.close()
