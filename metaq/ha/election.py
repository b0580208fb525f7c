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
``autoFailover=true``.

Functions here do blocking kazoo calls: run them in a worker thread.
"""

from __future__ import annotations

from kazoo.client import KazooClient

from ..zk.group import ZK_CALL_TIMEOUT_S, GroupState
from ..zk.paths import ZkPaths, decode_epoch, encode_epoch, encode_sync_set


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
) -> tuple[bool, str]:
    """May this broker try to take the master lock now? ``(yes, why)``."""
    if state.master_url is not None:
        return False, f"a master is registered ({state.master_url})"
    if cannot_lead is not None:
        return False, f"this broker failed to take up leading ({cannot_lead}); restart it once fixed"
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
