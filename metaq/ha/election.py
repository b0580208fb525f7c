"""Election in ZooKeeper: taking the master lock (the group's state is read by zk/group.py).

The master znode ``/brokers/ids/{id}/master`` is the lock; ``/brokers/ids/{id}/epoch``
numbers the masters. Taking over is one ZooKeeper transaction:

    check(epoch, version seen) ; create(master, ephemeral) ; set(epoch, epoch + 1)

so either a candidate holds the lock *and* owns the next epoch, or nothing
changed. Two candidates that saw the same epoch cannot both succeed (the second
fails the version check), and epochs only grow: every change is a
compare-and-set from the value read.

Who may try (``eligibility``) is decided from what ZooKeeper says, never from
heartbeats: in sync mode only the last master itself or a member of the sync
set it published (those hold every acked message); in async mode any slave
that was following the last master without a stopped partition, and only with
``autoFailover=true``; among several such slaves, the most caught-up one first
(``candidate_turn``).

Functions here do blocking kazoo calls: run them in a worker thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from ..zk.group import ZK_CALL_TIMEOUT_S, GroupState
from ..zk.paths import ZkPaths, decode_epoch, encode_epoch, encode_sync_set, slave_node_id


def _get(client: KazooClient, path: str) -> tuple[bytes, object]:
    return client.get_async(path).get(timeout=ZK_CALL_TIMEOUT_S)


def try_take_master(
    client: KazooClient, paths: ZkPaths, broker_id: int, url: str, seen: GroupState, identity: str | None = None
) -> int | None:
    """Atomically take the lock and the next epoch; the new epoch, or None if someone else did."""
    new_epoch = seen.epoch + 1
    value = encode_epoch(new_epoch, url, identity)
    epoch_path = paths.epoch(broker_id)
    tx = client.transaction()
    if seen.epoch_version < 0:
        tx.create(epoch_path, value)
    else:
        tx.check(epoch_path, seen.epoch_version)
        tx.set_data(epoch_path, value, version=seen.epoch_version)
    tx.create(paths.master(broker_id), url.encode(), ephemeral=True)
    results = tx.commit_async().get(timeout=ZK_CALL_TIMEOUT_S)
    # A failed transaction reports an exception per operation (the culprit, and
    # RolledBackError for the others); nothing was applied.
    if any(isinstance(r, Exception) for r in results):
        return None
    return new_epoch


def eligibility(
    *,
    mode: str,
    auto_failover: bool,
    my_url: str,
    my_identity: str | None = None,
    my_slave_id: int | None,
    prefers_master: bool,
    followed_epoch: int,
    replicas_healthy: bool,
    state: GroupState,
    cannot_lead: str | None = None,
    handover: "Handover | None" = None,
) -> tuple[bool, str]:
    """May this broker try to take the master lock now? ``(yes, why)``."""
    if state.master_url is not None:
        return False, f"a master is registered ({state.master_url})"
    if cannot_lead is not None:
        return False, f"this broker failed to take up leading ({cannot_lead}); restart it once fixed"
    if handover is not None and handover.epoch == state.epoch:
        # An operator's `metaq promote`: only the named slave may take this epoch's successor.
        if my_slave_id != handover.slave_id:
            return False, f"an operator hands broker group over to slave {handover.slave_id} (metaq promote)"
        if handover.unclean:
            return True, f"UNCLEAN election requested by an operator for slave {handover.slave_id}: acked messages this broker lacks are lost"
        return True, f"an operator hands the group over to this broker (slave {handover.slave_id})"
    if state.epoch_version < 0:
        # A group that never had a master: only a broker started as master founds it.
        if prefers_master:
            return True, "the group has no epoch yet; founding it"
        return False, "the group never had a master; waiting for one"
    if was_last_leader(state, my_url, my_identity):
        return True, f"this broker was the master of epoch {state.epoch}"
    if mode == "sync":
        if state.sync_set is None:
            return False, "no sync set was ever published"
        if my_slave_id is not None and my_slave_id in state.sync_set:
            return True, f"slave {my_slave_id} is in the sync set {sorted(state.sync_set)} of epoch {state.sync_set_epoch}"
        return False, f"not in the last sync set {sorted(state.sync_set)}: this broker may lack acked messages"
    if not auto_failover:
        return False, "autoFailover=false"
    if followed_epoch != state.epoch:
        return False, f"this broker did not follow the master of epoch {state.epoch} (followed {followed_epoch})"
    if not replicas_healthy:
        return False, "a replicated partition is stopped (diverged); not a safe master"
    return True, f"async failover from the master of epoch {state.epoch}"


#: How long a master hands over (writes paused) before it gives up and resumes writes.
HANDOVER_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Handover:
    """``metaq promote``: the slave that alone may succeed the master of ``epoch``."""

    slave_id: int
    epoch: int
    unclean: bool = False


def write_handover(client: KazooClient, paths: ZkPaths, broker_id: int, handover: Handover) -> None:
    path = paths.handover(broker_id)
    data = json.dumps({"slave": handover.slave_id, "epoch": handover.epoch, "unclean": handover.unclean}).encode()
    try:
        client.create_async(path, data, makepath=True).get(timeout=ZK_CALL_TIMEOUT_S)
    except NodeExistsError:
        client.set_async(path, data).get(timeout=ZK_CALL_TIMEOUT_S)


def read_handover(client: KazooClient, paths: ZkPaths, broker_id: int) -> Handover | None:
    try:
        data, _ = client.get_async(paths.handover(broker_id)).get(timeout=ZK_CALL_TIMEOUT_S)
    except NoNodeError:
        return None
    return decode_handover(data)


def decode_handover(data: bytes | None) -> Handover | None:
    try:
        value = json.loads(data or b"")
        return Handover(int(value["slave"]), int(value["epoch"]), bool(value.get("unclean", False)))
    except (ValueError, KeyError, TypeError):
        return None


def clear_handover(client: KazooClient, paths: ZkPaths, broker_id: int) -> None:
    try:
        client.delete_async(paths.handover(broker_id)).get(timeout=ZK_CALL_TIMEOUT_S)
    except NoNodeError:
        pass


def was_last_leader(state: GroupState, my_url: str, my_identity: str | None) -> bool:
    """Did this broker take the current epoch? Known by its identity (kept in its data dir, so
    a restart on another address keeps it), or by its url for epochs written without one."""
    if state.leader_identity is not None and my_identity is not None:
        return state.leader_identity == my_identity
    return state.leader_url == my_url


def publish_sync_set(
    client: KazooClient,
    paths: ZkPaths,
    broker_id: int,
    epoch: int,
    leader_url: str | None,
    members: frozenset[int],
    min_sync_slaves: int,
) -> None:
    """Write the sync set, only as the master of the current epoch, atomically so.

    The transaction checks the epoch node's version: a deposed master's late write
    (a retry after its session was lost) must never overwrite its successor's sync set.
    Raises RuntimeError if this broker does not lead the current epoch.
    """
    path = paths.sync_set(broker_id)
    epoch_path = paths.epoch(broker_id)
    data = encode_sync_set(members, epoch, min_sync_slaves)
    epoch_data, epoch_stat = _get(client, epoch_path)
    zk_epoch, leader = decode_epoch(epoch_data)
    if zk_epoch != epoch or (leader_url is not None and leader is not None and leader != leader_url):
        raise RuntimeError(f"not the master of epoch {zk_epoch} (we are in {epoch}); sync set not written")
    tx = client.transaction()
    tx.check(epoch_path, epoch_stat.version)
    if client.exists_async(path).get(timeout=ZK_CALL_TIMEOUT_S):
        tx.set_data(path, data)
    else:
        tx.create(path, data)
    results = tx.commit_async().get(timeout=ZK_CALL_TIMEOUT_S)
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"sync set not written (the epoch changed?): {failed[0]!r}")


# --- async mode: the most caught-up slave takes over ---------------------------------------
#
# In async mode an eligible slave holds every message the master acked up to its own log
# end, so the slave with the highest log end loses the fewest acked messages (as Redis
# Sentinel and RocketMQ's controller choose). Every orphaned slave posts its log end in
# ``candidates/slave{k}`` (ephemeral); the best eligible candidate (highest total log end,
# ties to the lowest slave id) tries the election. The others wait: until every live slave
# (a registered ``slave{k}``) has posted, or CANDIDATE_WAIT_S; and a candidate ranked r may
# try anyway once it has waited r x CANDIDATE_WAIT_S (the better ones did not take over:
# they died, or hang).

#: How long a candidate waits for a silent live slave, and for each better candidate to win.
CANDIDATE_WAIT_S = 1.0


@dataclass(frozen=True)
class Candidate:
    slave_id: int
    log_end: int  # the sum of its partitions' log ends
    epoch: int  # the epoch whose master is gone (the election round it posted in)
    eligible: bool  # whether the election rules let it take over at all


def post_candidacy(client: KazooClient, paths: ZkPaths, broker_id: int, me: Candidate) -> None:
    path = paths.candidate(broker_id, me.slave_id)
    data = json.dumps({"log_end": me.log_end, "epoch": me.epoch, "eligible": me.eligible}).encode()
    try:
        client.create_async(path, data, ephemeral=True, makepath=True).get(timeout=ZK_CALL_TIMEOUT_S)
    except NodeExistsError:
        client.set_async(path, data).get(timeout=ZK_CALL_TIMEOUT_S)


def withdraw_candidacy(client: KazooClient, paths: ZkPaths, broker_id: int, slave_id: int) -> None:
    try:
        client.delete_async(paths.candidate(broker_id, slave_id)).get(timeout=ZK_CALL_TIMEOUT_S)
    except NoNodeError:
        pass


def read_candidates(client: KazooClient, paths: ZkPaths, broker_id: int) -> tuple[dict[int, Candidate], set[int]]:
    """The posted candidacies, and the slave ids registered now (live sessions)."""
    live = {
        slave_id
        for child in client.get_children_async(paths.broker(broker_id)).get(timeout=ZK_CALL_TIMEOUT_S)
        if (slave_id := slave_node_id(child)) is not None
    }
    found: dict[int, Candidate] = {}
    try:
        children = client.get_children_async(paths.candidates(broker_id)).get(timeout=ZK_CALL_TIMEOUT_S)
    except NoNodeError:
        children = []
    for child in children:
        slave_id = slave_node_id(child)
        if slave_id is None:
            continue
        try:
            data, _ = client.get_async(f"{paths.candidates(broker_id)}/{child}").get(timeout=ZK_CALL_TIMEOUT_S)
            value = json.loads(data)
            found[slave_id] = Candidate(slave_id, int(value["log_end"]), int(value["epoch"]), bool(value["eligible"]))
        except (NoNodeError, ValueError, KeyError, TypeError):
            continue  # gone meanwhile, or not ours to read
    return found, live


def candidate_turn(me: int, epoch: int, candidates: dict[int, Candidate], live: set[int], waited_s: float) -> tuple[bool, str, float]:
    """May candidate ``me`` try the election now? ``(yes, why, retry after seconds)``."""
    eligible = sorted(
        (c for c in candidates.values() if c.eligible and c.epoch == epoch), key=lambda c: (-c.log_end, c.slave_id)
    )
    ranks = [c.slave_id for c in eligible]
    if me not in ranks:
        return False, "not a posted candidate", CANDIDATE_WAIT_S
    rank = ranks.index(me)
    standing = ", ".join(f"slave{c.slave_id}={c.log_end}" for c in eligible)
    posted = {c.slave_id for c in candidates.values() if c.epoch == epoch}
    silent = sorted(live - posted - {me})
    if silent and waited_s < CANDIDATE_WAIT_S:
        return False, f"waiting for live slaves {silent} to post their log ends (candidates: {standing})", CANDIDATE_WAIT_S - waited_s
    if rank == 0:
        return True, f"the most caught-up candidate (log ends: {standing})", 0.0
    turn_at = rank * CANDIDATE_WAIT_S
    if waited_s >= turn_at:
        return True, f"candidates ahead ({ranks[:rank]}) did not take over within {turn_at:.1f}s (log ends: {standing})", 0.0
    return False, f"slave{ranks[0]} is more caught up (log ends: {standing})", turn_at - waited_s
