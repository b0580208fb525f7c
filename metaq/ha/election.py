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
``autoFailover=true`` and every replica caught up with the master at least once since the
process started; among several such slaves, the most caught-up one first
(``candidate_turn``).

Functions here do blocking kazoo calls: run them in a worker thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from ..zk.group import ZK_CALL_TIMEOUT_S, GroupState
from ..zk.paths import ZkPaths, decode_epoch, decode_sync_set, encode_epoch, encode_sync_set, slave_node_id

# What a ZooKeeper call may raise when ZooKeeper is slow or away.
ZK_ERRORS = (KazooException, KazooTimeoutError)


def _get(client: KazooClient, path: str) -> tuple[bytes, object]:
    return client.get_async(path).get(timeout=ZK_CALL_TIMEOUT_S)


def try_take_master(
    client: KazooClient, paths: ZkPaths, broker_id: int, url: str, seen: GroupState, identity: str | None = None,
    floor: int = 0, depose: "Deposal | None" = None,
) -> int | None:
    """Atomically take the lock and the next epoch; the new epoch, or None if someone else did.

    The new epoch is above ``floor`` too: the newest epoch in any member's history that
    ZooKeeper, having lost its data, no longer knows (see "ZooKeeper lost its data" below).
    ``depose``: the lock is still held by the session of a master whose process died
    (takeover.py has the evidence); delete its node in the same transaction.
    """
    new_epoch = max(seen.epoch, floor) + 1
    value = encode_epoch(new_epoch, url, identity)
    epoch_path = paths.epoch(broker_id)
    tx = client.transaction()
    if seen.epoch_version < 0:
        tx.create(epoch_path, value)
    else:
        tx.check(epoch_path, seen.epoch_version)
        tx.set_data(epoch_path, value, version=seen.epoch_version)
    if depose is not None and not _add_deposal(client, paths, broker_id, tx, depose):
        return None
    tx.create(paths.master(broker_id), url.encode(), ephemeral=True)
    results = tx.commit_async().get(timeout=ZK_CALL_TIMEOUT_S)
    # A failed transaction reports an exception per operation (the culprit, and
    # RolledBackError for the others); nothing was applied.
    if any(isinstance(r, Exception) for r in results):
        return None
    return new_epoch


@dataclass(frozen=True)
class Deposal:
    """Deleting the lock of a dead master's session inside the election transaction."""

    session_id: int  # the master node's ephemeralOwner the evidence is about
    sync_member: int | None = None  # sync mode: our slave id, which must still be in the sync set


def _add_deposal(client: KazooClient, paths: ZkPaths, broker_id: int, tx: object, depose: Deposal) -> bool:
    """Add ``delete(master)`` (and ``check(sync_set)``) to ``tx``; False if the lock or the set changed.

    Invariant: only the dead session's node is deleted. It is read here, and any other
    master node can only have been created by this same transaction's kind, together with
    a new epoch, which fails the transaction's check of the epoch's version. In sync mode
    the sync set read here must still name us and is checked by version: a live master
    shrinking the set between our read and our commit fails the transaction.
    """
    master = paths.master(broker_id)
    stat = client.exists_async(master).get(timeout=ZK_CALL_TIMEOUT_S)
    if stat is None:
        return True  # the session expired meanwhile: the lock is free, the ordinary election
    if stat.ephemeralOwner != depose.session_id:
        return False
    if depose.sync_member is not None:
        try:
            data, sync_stat = _get(client, paths.sync_set(broker_id))
        except NoNodeError:
            return False
        try:
            members = decode_sync_set(data)[0]
        except ValueError:
            return False
        if depose.sync_member not in members:
            return False
        tx.check(paths.sync_set(broker_id), sync_stat.version)  # type: ignore[attr-defined]
    tx.delete(master, version=stat.version)  # type: ignore[attr-defined]
    return True


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
    never_caught_up: tuple[str, ...] = (),
    cannot_lead: str | None = None,
    handover: "Handover | None" = None,
    history: int = 0,
    led_history: bool = False,
) -> tuple[bool, str]:
    """May this broker try to take the master lock now? ``(yes, why)``.

    ``history`` is the newest epoch in this broker's epoch checkpoints, ``led_history``
    whether it led that epoch itself (epochs.read_led_epoch). ``never_caught_up``: the
    partitions whose replica has never reached its master's log end since this process
    started (followership.never_caught_up).
    """
    if state.master_url is not None:
        return False, f"a master is registered ({state.master_url})"
    if cannot_lead is not None:
        return False, f"this broker failed to take up leading ({cannot_lead}); it tries again later, or restart it once fixed"
    if handover is not None and handover.epoch == state.epoch:
        # An operator's `metaq promote`: only the named slave may take this epoch's successor.
        if my_slave_id != handover.slave_id:
            return False, f"an operator hands broker group over to slave {handover.slave_id} (metaq promote)"
        if handover.unclean:
            return True, f"UNCLEAN election requested by an operator for slave {handover.slave_id}: acked messages this broker lacks are lost"
        return True, f"an operator hands the group over to this broker (slave {handover.slave_id})"
    if history > state.epoch:
        # Invariant: ZooKeeper's epoch is at least every member's newest epoch (an epoch is
        # taken in ZooKeeper before any checkpoint records it; slaves copy checkpoints from
        # a master of an epoch ZooKeeper had). A history past it means ZooKeeper lost its
        # data: founding or electing from what it says now would start an epoch this log
        # already has. Only the broker that led the newest epoch holds every message acked
        # in it; it alone may re-seed the group, once no posted member knows a newer epoch
        # (reseed_turn). The others wait for it, or for an operator's `metaq promote --unclean`.
        if led_history:
            return True, f"ZooKeeper lost the group's state (epoch {state.epoch} there); this broker led epoch {history}, its newest"
        return False, (
            f"ZooKeeper lost the group's state (epoch {state.epoch} there, {history} in this broker's history):"
            f" waiting for the broker that led epoch {history} to re-seed the group"
        )
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
    if never_caught_up:
        # Invariant (async): only a slave that was in sync once (Kafka's ISR) is elected without
        # an operator. A replica that never reached its master's log end since this process
        # started (a replaced, empty data dir; a restart that is still catching up) may lack
        # everything the group holds, not just the lag of a crash: electing it would make the
        # members that hold the log throw it away.
        shown = ", ".join(never_caught_up[:3]) + (f" and {len(never_caught_up) - 3} more" if len(never_caught_up) > 3 else "")
        return False, f"this broker has not caught up with its master since it started ({shown}): it may lack far more than the lag"
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
# (a registered ``slave{k}``) has posted, or CANDIDATE_WAIT_S. A candidate ranked r whose
# betters hold no more than it does (a tie) may try anyway once it has waited
# r x CANDIDATE_WAIT_S (they did not take over: they died, or hang). A candidate behind a
# posted better one waits while that one's candidacy stands, up to r x BETTER_CANDIDATE_WAIT_S:
# the node is ephemeral, so a better candidate that died loses it with its session and the
# next one goes then; one that lives but never elects itself is waited out. Rule (async): a
# replica is not elected over a live eligible candidate that holds more of the log unless that
# one did not take over within the bound. Timing out on a live one instead is what, on a loaded machine
# (elections several seconds late), promoted a freshly replaced, empty slave over a slave
# holding 200 KB, and every slave then had to throw its log away.

#: How long a candidate waits for a silent live slave, and for each better candidate to win.
CANDIDATE_WAIT_S = 1.0
#: How long a candidate waits for each better candidate that holds more of the log: long enough
#: for an election several seconds late on a loaded machine (4.5 s from posting to winning was
#: seen at load 46), short enough that a live candidate that never elects itself costs a bounded
#: failover, not a group without a master.
BETTER_CANDIDATE_WAIT_S = 8.0


@dataclass(frozen=True)
class Candidate:
    slave_id: int
    log_end: int  # the sum of its partitions' log ends
    epoch: int  # the epoch whose master is gone (the election round it posted in)
    eligible: bool  # whether the election rules let it take over at all


def _post(client: KazooClient, path: str, value: dict[str, object]) -> None:
    """Create or overwrite an ephemeral node of ours (it goes with our session)."""
    data = json.dumps(value).encode()
    try:
        client.create_async(path, data, ephemeral=True, makepath=True).get(timeout=ZK_CALL_TIMEOUT_S)
    except NodeExistsError:
        client.set_async(path, data).get(timeout=ZK_CALL_TIMEOUT_S)


def _withdraw(client: KazooClient, path: str) -> None:
    try:
        client.delete_async(path).get(timeout=ZK_CALL_TIMEOUT_S)
    except NoNodeError:
        pass


def post_candidacy(client: KazooClient, paths: ZkPaths, broker_id: int, me: Candidate) -> None:
    _post(client, paths.candidate(broker_id, me.slave_id), {"log_end": me.log_end, "epoch": me.epoch, "eligible": me.eligible})


def withdraw_candidacy(client: KazooClient, paths: ZkPaths, broker_id: int, slave_id: int) -> None:
    _withdraw(client, paths.candidate(broker_id, slave_id))


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
    mine = eligible[rank].log_end
    ahead = [c for c in eligible[:rank] if c.log_end > mine]
    if ahead and waited_s < rank * BETTER_CANDIDATE_WAIT_S:
        # Not on the ties' short turn: the better candidate is alive (its candidacy is ephemeral)
        # and electing us would throw away what it holds past our log end. Bounded all the same:
        # a live candidate that never gets to elect itself (its loop stuck, its ZooKeeper session
        # kept by the client's thread) must not leave the group without a master for good.
        return False, (f"slave{ranks[0]} is more caught up (log ends: {standing}); waiting while its candidacy"
                       f" stands, at most {rank * BETTER_CANDIDATE_WAIT_S:.0f}s"), CANDIDATE_WAIT_S
    turn_at = rank * CANDIDATE_WAIT_S
    if waited_s >= turn_at:
        return True, f"candidates ahead ({ranks[:rank]}) did not take over within {turn_at:.1f}s (log ends: {standing})", 0.0
    return False, f"slave{ranks[0]} is more caught up (log ends: {standing})", turn_at - waited_s


# --- ZooKeeper lost its data: the member with the newest history re-seeds the group -----------
#
# ZooKeeper restarted empty (or from an old snapshot) forgets the epoch, the master's identity
# and the sync set: nothing there says any more who holds every acked message. Each member's
# data dir still does: its epoch checkpoints (the newest epoch it took part in) and
# ``led-epoch`` (the newest epoch it led). Every member that finds its history past ZooKeeper's
# epoch posts a claim (ephemeral ``reseed/{identity}``, written with the group's ZooKeeper ACL
# when security is on, so only members of the group can post): its newest epoch, whether it led
# it, its log end. The broker that led the newest epoch re-seeds the group (takes the lock at
# an epoch above every posted history) once it has waited RESEED_WAIT_S for the others to post
# and none posted a newer epoch; the others follow it and truncate against it as after any
# failover (in that epoch their logs are prefixes of its log: only never-acked bytes go). A
# slave that knows a newer epoch than a candidate holds it back: a stale log never re-seeds
# while a live member knows better. What no claim can show is a member that is down: see
# docs/operations.md, "Losing ZooKeeper's data" (start every member first).

#: How long the broker that led the newest epoch waits for the other members' claims.
RESEED_WAIT_S = 3.0


@dataclass(frozen=True)
class ReseedClaim:
    identity: str  # the member's stable identity (datadirs.broker_identity)
    url: str
    history: int  # the newest epoch in its epoch checkpoints
    led: bool  # whether it led that epoch
    log_end: int  # the sum of its partitions' log ends


def post_reseed_claim(client: KazooClient, paths: ZkPaths, broker_id: int, me: ReseedClaim) -> None:
    _post(client, paths.reseed_claim(broker_id, me.identity), {"url": me.url, "history": me.history, "led": me.led, "log_end": me.log_end})


def withdraw_reseed_claim(client: KazooClient, paths: ZkPaths, broker_id: int, identity: str) -> None:
    _withdraw(client, paths.reseed_claim(broker_id, identity))


def read_reseed_claims(client: KazooClient, paths: ZkPaths, broker_id: int) -> list[ReseedClaim]:
    base = paths.reseed_claims(broker_id)
    try:
        children = client.get_children_async(base).get(timeout=ZK_CALL_TIMEOUT_S)
    except NoNodeError:
        return []
    claims = []
    for identity in sorted(children):
        try:
            data, _ = client.get_async(f"{base}/{identity}").get(timeout=ZK_CALL_TIMEOUT_S)
            value = json.loads(data)
            claims.append(ReseedClaim(identity, str(value["url"]), int(value["history"]), bool(value["led"]), int(value["log_end"])))
        except (NoNodeError, ValueError, KeyError, TypeError):
            continue  # gone meanwhile, or not a claim
    return claims


def reseed_turn(me: ReseedClaim, claims: list[ReseedClaim], waited_s: float) -> tuple[bool, str, float]:
    """May ``me`` (which led its newest epoch) re-seed the group now? ``(yes, why, retry after seconds)``."""
    others = [c for c in claims if c.identity != me.identity]
    standing = ", ".join(f"{c.url}: epoch {c.history}{' (led)' if c.led else ''}" for c in [me, *others])
    # Two claims that led the same epoch cannot both be right; the identity breaks the tie
    # so that exactly one of them goes (the other then follows and is checked by truncation).
    newer = [c for c in others if c.history > me.history or (c.history == me.history and c.led and c.identity < me.identity)]
    if newer:
        return False, f"{newer[0].url} knows a newer epoch ({standing})", RESEED_WAIT_S
    if waited_s < RESEED_WAIT_S:
        return False, f"waiting for the other members' claims ({standing})", RESEED_WAIT_S - waited_s
    return True, f"no member posted a newer history within {RESEED_WAIT_S:.0f}s ({standing})", 0.0
