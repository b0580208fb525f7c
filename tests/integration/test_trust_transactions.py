"""Transaction ownership with security on: real brokers, real ZooKeeper.

Users ``app`` and ``rival`` may both produce every topic (neither is admin); ``reader`` may
only consume. Every step is a raw request on a connection logged in as one of them, so each
refusal is seen exactly as the broker answers it.

* a prepared XA branch stays its starter's through a kill -9 restart of the master and
  through a kill -9 failover of a sync pair: ``rival``'s ``recover`` does not list it and
  its ``rollback`` / ``commit`` get 403, while ``app`` recovers and commits it (the starter
  is journaled and carried, as a keyed tag, in the PREPARE markers the slave replicated);
* ``rival`` cannot slip a message into ``app``'s open transaction: a put with ``app``'s xid
  under ``rival``'s own producer id and token gets 403 and stores nothing, and ``app``'s
  commit commits only ``app``'s messages;
* ``start`` and ``recover`` need produce on some topic (``reader`` gets 403, marked
  ``reason: "acl"`` like a topic ACL's refusal) and a user holds at most
  ``maxOpenTransactionsPerUser`` live branches (3 here): the next start gets 403, another
  user still starts, and a branch ended makes room again;
* an anonymous ZooKeeper client reading a transactional id's node learns no user name:
  the owner is recorded as a keyed tag (and another user's init of the name is refused
  without naming the owner).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from metaq.client import Message
from metaq.client.codec import encode_messages
from metaq.protocol import commands as c
from metaq.protocol.messages import InitProducerRequest, PutRequest, TransactionRequest
from metaq.security.group import GroupSecret
from metaq.security.principal_tags import PrincipalTags
from metaq.tools.launcher import BrokerFactory, BrokerProcess, wait_until
from metaq.txn.xa import Code
from metaq.zk.paths import ZkPaths
from tests.harness import kazoo_client

from .failover_support import GROUP, TOPIC, ZK_SETTINGS, Group
from .test_trust_producer_ids import secured_pair
from .trust_support import SecuredGroup, request_as, run


OPEN_CAP = 3


class Producer:
    """One user's producer id on one broker: init, transactional puts, transaction steps."""

    def __init__(self, broker: BrokerProcess, user: str) -> None:
        self.broker, self.user = broker, user
        reply = self.request(InitProducerRequest().to_header())
        assert reply.code == c.OK, reply.header
        self.producer_id, self.epoch, self.token = int(reply["producer_id"]), int(reply["epoch"]), reply["producer_token"]
        self.sequence = 0

    def request(self, header: dict[str, Any], body: bytes = b"") -> Any:
        return run(request_as(self.broker, self.user, header, body))

    def numbers(self) -> dict[str, Any]:
        return {"producer_id": self.producer_id, "producer_epoch": self.epoch, "producer_token": self.token}

    def put(self, xid: str, *payloads: bytes) -> Any:
        body, _ = encode_messages([Message(TOPIC, p) for p in payloads])
        header = PutRequest(topic=TOPIC, partition=0, count=len(payloads), sequence=self.sequence, txid=xid,
                            **self.numbers()).to_header()
        reply = self.request(header, body)
        if reply.code == c.OK:
            self.sequence += len(payloads)
        return reply

    def step(self, action: str, xid: str = "", **fields: Any) -> Any:
        """A transaction step as ``self.user``; a start carries this producer's id and token."""
        if action == "start":
            fields = {**self.numbers(), **fields}
        return step_as(self.broker, self.user, action, xid, **fields)

    def prepared(self, xid: str, *payloads: bytes) -> None:
        """start, put ``payloads``, end, prepare: a branch in doubt, ``self.user``'s."""
        assert self.step("start", xid)["xa_code"] == Code.XA_OK
        assert self.put(xid, *payloads).code == c.OK
        assert self.step("end", xid)["xa_code"] == Code.XA_OK
        assert self.step("prepare", xid)["xa_code"] == Code.XA_OK


def step_as(broker: BrokerProcess, user: str, action: str, xid: str = "", **fields: Any) -> Any:
    """The reply to a transaction step; 503 (a master recovering after a start or take-over) is retried."""
    header = TransactionRequest(action=action, xid=xid, **fields).to_header()
    replies: list[Any] = []

    def answered() -> bool:
        replies.append(run(request_as(broker, user, header)))
        return replies[-1].code != c.SERVICE_UNAVAILABLE

    wait_until(answered, 30, interval=0.1, message=f"{action} {xid} to be answered")
    return replies[-1]


def assert_only_its_starter_decides(broker: BrokerProcess, xid: str) -> None:
    """``rival`` neither sees nor decides ``app``'s prepared branch; ``app`` commits it."""
    assert xid not in step_as(broker, "rival", "recover")["xids"]
    for action in ("rollback", "commit"):
        refused = step_as(broker, "rival", action, xid)
        assert refused.code == c.FORBIDDEN and f"may not decide transaction {xid}" in refused.message, refused.header
    assert step_as(broker, "app", "recover")["xids"] == [xid]
    assert step_as(broker, "app", "commit", xid)["xa_code"] == Code.XA_OK
    assert step_as(broker, "app", "recover")["xids"] == []


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> SecuredGroup:
    return SecuredGroup(tmp_path_factory.mktemp("security"))


@pytest.fixture(scope="module")
def master(zk: Any, secured: SecuredGroup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One secured master of group 0, shared by the single-broker checks (the restart runs last)."""
    factory = BrokerFactory(tmp_path_factory.mktemp("brokers"), zk.connect_string, f"/meta-{uuid.uuid4().hex[:12]}")
    try:
        yield factory(GROUP, {TOPIC: 1}, {"unflushThreshold": 0, "maxOpenTransactionsPerUser": OPEN_CAP, **secured.system},
                      zookeeper=ZK_SETTINGS)
    finally:
        factory.stop_all()


def test_another_user_cannot_put_into_an_open_transaction(master: BrokerProcess) -> None:
    app, rival = Producer(master, "app"), Producer(master, "rival")
    xid = "TX:app:injected"
    assert app.step("start", xid)["xa_code"] == Code.XA_OK
    assert app.put(xid, b"app-own-0").code == c.OK
    injected = rival.put(xid, b"injected-by-rival")
    assert injected.code == c.FORBIDDEN and f"user 'rival' may not put in transaction {xid}" in injected.message, \
        injected.header
    assert app.put(xid, b"app-own-1").code == c.OK
    assert app.step("end", xid)["xa_code"] == Code.XA_OK
    assert app.step("commit_one_phase", xid)["xa_code"] == Code.XA_OK
    _start, on_disk = master.disk_log(TOPIC, 0)
    assert b"app-own-0" in on_disk and b"app-own-1" in on_disk
    assert b"injected-by-rival" not in on_disk, "the intruder's message reached the log"


def test_a_start_or_recover_needs_produce_rights_and_a_start_room_under_the_users_cap(master: BrokerProcess) -> None:
    refused = step_as(master, "reader", "start", "TX:reader:0")
    assert refused.code == c.FORBIDDEN and "user 'reader' may not produce any topic" in refused.message, refused.header
    refused = step_as(master, "reader", "recover")
    assert refused.code == c.FORBIDDEN, refused.header
    assert "may not recover transactions: user 'reader' may not produce any topic" in refused.message, refused.header
    # Authorization refusals say so in a field (clients need not parse the words); this one
    # from the transaction service, a topic ACL's from the connection's check.
    assert refused.header.get(c.REASON_FIELD) == c.ACCESS_DENIED, refused.header
    put = PutRequest(topic=TOPIC, partition=0, count=1).to_header()
    denied = run(request_as(master, "reader", put, encode_messages([Message(TOPIC, b"x")])[0]))
    assert denied.code == c.FORBIDDEN and denied.header.get(c.REASON_FIELD) == c.ACCESS_DENIED, denied.header
    held = [f"TX:app:held-{n}" for n in range(OPEN_CAP)]
    for xid in held:
        assert step_as(master, "app", "start", xid)["xa_code"] == Code.XA_OK
    full = step_as(master, "app", "start", "TX:app:one-too-many")
    assert full.code == c.FORBIDDEN and "maxOpenTransactionsPerUser" in full.message, full.header
    assert c.REASON_FIELD not in full.header  # not the ACL's: ending a branch makes room
    assert step_as(master, "rival", "start", "TX:rival:0")["xa_code"] == Code.XA_OK  # per user
    for user, xid in [("app", held[0]), ("rival", "TX:rival:0")]:
        assert step_as(master, user, "end", xid)["xa_code"] == Code.XA_OK
        assert step_as(master, user, "rollback", xid)["xa_code"] == Code.XA_OK
    assert step_as(master, "app", "start", "TX:app:one-too-many")["xa_code"] == Code.XA_OK  # room again
    for xid in [*held[1:], "TX:app:one-too-many"]:
        assert step_as(master, "app", "end", xid)["xa_code"] == Code.XA_OK
        assert step_as(master, "app", "rollback", xid)["xa_code"] == Code.XA_OK


def test_an_anonymous_zookeeper_reader_learns_no_owner_of_a_transactional_id(
        master: BrokerProcess, secured: SecuredGroup) -> None:
    init = InitProducerRequest(transactional_id="billing-eu").to_header()
    assert run(request_as(master, "app", init)).code == c.OK
    refused = run(request_as(master, "rival", init))
    assert refused.code == c.FORBIDDEN and "belongs to another user" in refused.message, refused.header
    assert "app" not in refused.message
    node = f"{ZkPaths(master.zk_root).broker(GROUP)}/transactional_ids/billing-eu"
    with kazoo_client(master.zk_connect) as anonymous:  # no credentials: world READ only
        raw, _stat = anonymous.get(node)
    recorded = json.loads(raw)
    tag = PrincipalTags(GroupSecret.load(secured.secret_file, GROUP).principal_tag_key()).tag("app")
    assert recorded == {"producer_id": recorded["producer_id"], "epoch": 0, "user_tag": tag}, recorded
    assert b"app" not in raw


def test_a_prepared_branch_stays_its_starters_through_a_restart(master: BrokerProcess) -> None:
    xid = "XID:1:726573746172:74"
    Producer(master, "app").prepared(xid, b"restart-0", b"restart-1")
    master.restart(kill=True)
    assert_only_its_starter_decides(master, xid)


def test_a_prepared_branch_stays_its_starters_through_a_failover(
        broker_factory: Any, zk_client: Any, zk_root: str, tmp_path: Path) -> None:
    group = Group(zk_client, zk_root)
    a, b = secured_pair(broker_factory, SecuredGroup(tmp_path / "security"), group)
    xid = "XID:1:6661696c6f766572:74"
    Producer(a, "app").prepared(xid, b"failover-0", b"failover-1")  # sync mode: B holds the PREPARE marker
    epoch = group.epoch()
    a.kill()
    wait_until(lambda: group.master() == b.url and group.epoch() > epoch, 30, message="B to lead")
    assert_only_its_starter_decides(b, xid)
