"""Producer ids are verified, not claimed: a secured sync pair, real processes and ZooKeeper.

Users ``app`` and ``rival`` may both produce (neither is admin). A producer id and epoch in a put or a
transaction step count only with the ``producer_token`` init_producer gave their user:

* ``rival`` cannot put under ``app``'s producer id (no token, ``app``'s token, its own
  token): 403 naming the id, and ``app``'s own first puts under that id are then stored
  and acked normally (not answered as duplicates of the intruder's);
* ``rival`` cannot claim a higher epoch of its own id (the epoch is inside the token);
* ``rival`` cannot decide ``app``'s empty branch;
* ``app``'s idempotent stream through a kill -9 failover of the pair stays exactly once:
  the new master verifies the tokens the old one issued (same group key, no state).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from metaq.client import Message, MessageSessionFactory, MetaClientConfig
from metaq.client.codec import encode_messages
from metaq.client.connection import Credentials
from metaq.protocol.messages import InitProducerRequest, PutRequest, TransactionRequest
from metaq.security.handshake import ClientAuthenticator
from metaq.tools.launcher import BrokerProcess, wait_until

from .failover_support import GROUP, SLAVE_B, TOPIC, ZK_SETTINGS, Group, fetch_all, sync_system, wait_in_sync_set
from .test_idempotent_failover import Load
from .trust_support import PASSWORDS, SecuredGroup, open_as, run


def secured_pair(factory: Any, secured: SecuredGroup, group: Group, partitions: int = 1) -> tuple[BrokerProcess, BrokerProcess]:
    """A sync master A and slave B with security on; B in the sync set (ZooKeeper says so: stats need a login)."""
    system = sync_system(**secured.system)
    a = factory(GROUP, {TOPIC: partitions}, system, name="A", zookeeper=ZK_SETTINGS)
    b = factory(GROUP, {TOPIC: partitions}, system, {"slaveId": SLAVE_B}, name="B", zookeeper=ZK_SETTINGS)
    wait_in_sync_set(group, SLAVE_B, timeout=30)
    return a, b


async def _session(broker: BrokerProcess, user: str, steps: list[tuple[dict[str, Any], bytes]]) -> list[Any]:
    """The replies of ``steps`` sent in order on one connection logged in as ``user``."""
    conn = await open_as(broker, user)
    try:
        return [await conn.request(header, body, timeout=30) for header, body in steps]
    finally:
        conn.close()


def init(broker: BrokerProcess, user: str) -> tuple[int, int, str]:
    (reply,) = run(_session(broker, user, [(InitProducerRequest().to_header(), b"")]))
    assert reply.code == 200, reply.message
    return int(reply["producer_id"]), int(reply["epoch"]), str(reply["producer_token"])


def numbered_put(broker: BrokerProcess, user: str, payloads: list[bytes], **numbers: Any) -> Any:
    body, _ = encode_messages([Message(TOPIC, p) for p in payloads])
    header = PutRequest(topic=TOPIC, partition=0, count=len(payloads), **numbers).to_header()
    (reply,) = run(_session(broker, user, [(header, body)]))
    return reply


def test_another_user_cannot_put_under_an_id_or_claim_an_epoch_or_decide_an_empty_branch(
        broker_factory, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    secured = SecuredGroup(tmp_path / "security")
    a, _b = secured_pair(broker_factory, secured, Group(zk_client, zk_root))
    app_id, app_epoch, app_token = init(a, "app")
    other_id, other_epoch, other_token = init(a, "rival")
    assert app_token != other_token

    intruder = [b"intruder"] * 8
    for token in (None, app_token, other_token):
        refused = numbered_put(a, "rival", intruder, producer_id=app_id, producer_epoch=0, sequence=0,
                               producer_token=token)
        assert refused.code == 403 and f"producer id {app_id} not issued to rival" in refused.message, refused.header
    refused = numbered_put(a, "rival", intruder, producer_id=other_id, producer_epoch=other_epoch + 1, sequence=0,
                           producer_token=other_token)
    assert refused.code == 403 and "not issued to rival" in refused.message, "a claimed higher epoch"

    acked = numbered_put(a, "app", [b"app-0", b"app-1"], producer_id=app_id, producer_epoch=app_epoch, sequence=0,
                         producer_token=app_token)
    assert acked.code == 200 and not acked.get("duplicate"), acked.header
    auth = ClientAuthenticator("app", PASSWORDS["app"])
    stored = [data for data in fetch_all(a, authenticator=auth).values() if data in (b"app-0", b"app-1", b"intruder")]
    assert stored == [b"app-0", b"app-1"], "the intruder stored nothing and the owner's batch is not a duplicate"

    # An empty branch (no put yet): only the user that started it (or admin) decides it.
    start = TransactionRequest(action="start", xid="XA:app-empty", producer_id=app_id, producer_epoch=app_epoch,
                               producer_token=app_token).to_header()
    (started,) = run(_session(a, "app", [(start, b"")]))
    assert started.code == 200 and started["xa_code"] == 0, started.header
    for action in ("end", "rollback"):
        (refused,) = run(_session(a, "rival", [(TransactionRequest(action=action, xid="XA:app-empty").to_header(), b"")]))
        assert refused.code == 403 and "may not decide transaction XA:app-empty" in refused.message, refused.header
    steps = [(TransactionRequest(action=action, xid="XA:app-empty").to_header(), b"") for action in ("end", "rollback")]
    assert [r["xa_code"] for r in run(_session(a, "app", steps))] == [0, 0]


def test_an_idempotent_stream_stays_exactly_once_through_a_secured_failover(
        broker_factory, zk, zk_client, zk_root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    secured = SecuredGroup(tmp_path / "security")
    group = Group(zk_client, zk_root)
    a, b = secured_pair(broker_factory, secured, group, partitions=2)
    epoch_before = group.epoch()
    config = MetaClientConfig(zk_connect=zk.connect_string, zk_root=zk_root, zk_session_timeout_ms=4000,
                              request_timeout_s=3, send_timeout_s=60, send_max_attempts=10_000,
                              send_retry_max_wait_s=0.2, idempotence=True,
                              credentials=Credentials("app", PASSWORDS["app"]))
    with MessageSessionFactory(config) as factory:
        load = Load(factory, interval=0.002).start()
        wait_until(lambda: load.acked() >= 200, 30, message="200 acks from A")
        a.kill()
        wait_until(lambda: group.master() == b.url and group.epoch() > epoch_before, 30, message="B to lead")
        acked_before = load.acked()
        wait_until(lambda: load.acked() >= acked_before + 200, 60, message="200 more acks from B")
        results = load.stop()

    failed = [(p, r.error_message) for p, r in results if not r.success]  # type: ignore[attr-defined]
    assert not failed, failed[:3]
    on_b = {n: fetch_all(b, partition=n, authenticator=ClientAuthenticator("app", PASSWORDS["app"])) for n in range(2)}
    copies = Counter(data for records in on_b.values() for data in records.values() if data.startswith(b"idem-"))
    assert not {p: n for p, n in copies.items() if n > 1}, "duplicates"
    assert len(copies) == len(results), "every acked message is on B"
    assert "not issued" not in b.log_text()
