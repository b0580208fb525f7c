"""``metaq cluster remove-group|remove-slave``: forget a broker group, or one slave of it, that is gone for good.

A group's persistent nodes (``{root}/brokers/ids/{id}`` with its ``epoch``, ``sync_set``,
``handover``, ``producer_ids``, and ``{root}/brokers/topic-config/{id}``) outlive its
brokers, so a throwaway group shows ``NO MASTER`` in ``metaq cluster`` forever.

``remove-group`` deletes them; ``remove-slave`` takes one slave id out of the group's
sync set (and withdraws a ``metaq promote`` hand-over to it). Both refuse while a member they concern is alive: a live broker holds an
ephemeral node (``master``, ``slave{k}``, ``candidates/slave{k}``) under the group, so
"alive" is what ZooKeeper says, not what anyone claims.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import MetaqError, UsageError
from .login import zk_write_refused


def _require_broker_id(args: argparse.Namespace) -> int:
    if args.broker_id is None:
        raise UsageError(f"metaq cluster {args.action} needs --broker-id ID")
    return int(args.broker_id)


def check_remove_options(args: argparse.Namespace) -> None:
    """UsageError unless the options name what to remove (a group; a slave of it)."""
    _require_broker_id(args)
    if args.action == "remove-slave" and args.slave_id is None:
        raise UsageError("metaq cluster remove-slave needs --slave-id K")


def _alive(client: Any, paths: Any, broker_id: int) -> list[str]:
    """The group's live members, by the ephemeral nodes their sessions hold."""
    from kazoo.exceptions import NoNodeError

    from ..zk.group import read_members

    members = read_members(client, paths, broker_id)
    alive = ([f"master {members.master_url}"] if members.master_url else [])
    alive += [f"slave{k} {url}" for k, url in members.slaves.items()]
    try:
        alive += [f"{child} (an orphaned slave, electing)" for child in client.get_children(paths.candidates(broker_id))]
    except NoNodeError:
        pass
    return alive


def _descendants(client: Any, path: str) -> list[str]:
    """Every node below ``path``, deepest first (the order they can be deleted in)."""
    found: list[str] = []
    for child in client.get_children(path):
        below = f"{path}/{child}"
        found += _descendants(client, below) + [below]
    return found


def remove_group(args: argparse.Namespace, client: Any, paths: Any) -> list[str]:
    """Delete a dead group's nodes in one ZooKeeper transaction; the report's lines."""
    from kazoo.exceptions import NoAuthError, NoNodeError, NotEmptyError

    broker_id = _require_broker_id(args)
    base = paths.broker(broker_id)
    try:
        alive = _alive(client, paths, broker_id)
        nodes = _descendants(client, base) + [base]
    except NoNodeError:
        alive, nodes = [], []
    if alive:
        raise MetaqError(f"broker group {broker_id} has live members ({'; '.join(alive)}): stop them first; nothing removed")
    lines = []
    if nodes:
        # One transaction: a member registering meanwhile adds an ephemeral child, the
        # parent's delete then fails (not empty) and nothing at all is removed.
        tx = client.transaction()
        for node in nodes:
            tx.delete(node)
        results = tx.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        if any(isinstance(r, NoAuthError) for r in failed):
            raise zk_write_refused(args, f"the removal of {base}")
        if any(isinstance(r, NotEmptyError) for r in failed):
            raise MetaqError(f"broker group {broker_id}: a member registered meanwhile; nothing removed")
        if failed:
            raise MetaqError(f"broker group {broker_id}: ZooKeeper refused the removal of {base}: {failed[0]!r}; nothing removed")
        lines.append(f"removed {base} and its {len(nodes) - 1} node(s) (epoch, sync set, producer ids, ...)")
    config = paths.topic_config(broker_id)
    try:
        client.delete(config)
        lines.append(f"removed {config} (the group's topics)")
    except NoNodeError:
        pass
    except NoAuthError:
        # Its directory grants no delete once a secured group made it (zk/acl.py): empty it
        # instead, so a new group with this id never serves the old group's topics.
        from ..zk.topic_config import GroupTopics, read_group_topics, update_group_topics

        if read_group_topics(client, paths, broker_id).encode() != GroupTopics().encode():
            try:
                update_group_topics(client, paths, broker_id, lambda group: GroupTopics(version=group.version))
            except NoAuthError:
                raise zk_write_refused(args, f"the write of {config}") from None
            lines.append(f"emptied {config} (the group's topics; its directory allows no delete)")
    if not lines:
        raise MetaqError(f"no broker group {broker_id} under {args.zk_root}")
    lines.append(f"broker group {broker_id} removed; do not restart its old brokers with their data dirs under this id")
    return lines


def remove_slave(args: argparse.Namespace, client: Any, paths: Any) -> list[str]:
    """Take a dead slave out of its group's sync set (compare-and-set); the report's lines."""
    from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError

    from ..ha.election import clear_handover, read_handover
    from ..zk.paths import decode_sync_set, encode_sync_set

    check_remove_options(args)  # run() asked first, before connecting; kept for other callers
    broker_id = int(args.broker_id)
    slave = f"slave{args.slave_id}"
    try:
        alive = _alive(client, paths, broker_id)
    except NoNodeError:
        raise MetaqError(f"no broker group {broker_id} under {args.zk_root}") from None
    if any(entry.startswith(f"{slave} ") for entry in alive):
        raise MetaqError(f"{slave} of broker group {broker_id} is alive ({'; '.join(alive)}): stop it first; nothing removed")
    if any(entry.startswith("master ") for entry in alive):
        # The master owns its sync set: it drops a lost slave itself (syncSlaveTimeoutMs), and
        # a write here would race its own publication.
        raise MetaqError(f"broker group {broker_id} has a live master ({alive[0]}): it removes a lost slave from its sync set itself")
    lines = []
    try:
        data, stat = client.get(paths.sync_set(broker_id))
    except NoNodeError:
        data, stat = None, None
    members, epoch = decode_sync_set(data) if data is not None else (frozenset(), 0)
    if args.slave_id in members:
        # A smaller set never widens who may take over (election.eligibility): no acked
        # message can be lost by it. The epoch stays the one that chose the set.
        remaining = members - {args.slave_id}
        try:
            client.set(paths.sync_set(broker_id), encode_sync_set(remaining, epoch, _min_sync_slaves(data)), version=stat.version)
        except BadVersionError:
            raise MetaqError(f"broker group {broker_id}'s sync set changed meanwhile; nothing removed (run it again)") from None
        except NoAuthError:
            raise zk_write_refused(args, f"the write of {paths.sync_set(broker_id)}") from None
        lines.append(f"broker group {broker_id}: {slave} removed from the sync set (now {sorted(remaining)}, epoch {epoch})")
    handover = read_handover(client, paths, broker_id)
    if handover is not None and handover.slave_id == args.slave_id:
        # A hand-over to a slave that is gone would leave the group to nobody; without it
        # the ordinary rule (the last master or a sync-set member) decides again.
        try:
            clear_handover(client, paths, broker_id)
        except NoAuthError:
            raise zk_write_refused(args, f"the removal of {paths.handover(broker_id)}") from None
        lines.append(f"broker group {broker_id}: the hand-over to {slave} (metaq promote) withdrawn")
    if not lines:
        raise MetaqError(f"broker group {broker_id}: neither its sync set ({sorted(members)}) nor a hand-over names {slave}; nothing to remove")
    return lines


def _min_sync_slaves(data: bytes) -> int:
    import json

    value = json.loads(data)
    return int(value.get("min_sync_slaves", 0))
