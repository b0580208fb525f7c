"""Takeover records: what each master says of the takeover that made it master, kept in ZooKeeper.

Theory of operation: a broker that wins an epoch (an election after the old master's session
expired, a fast takeover on the old master's process death, a `metaq promote` hand-over, an
unclean election, or the first master of a group) writes, once it leads and serves,

    {root}/brokers/ids/{id}/failovers/{epoch:010d}      {"epoch", "at_ms", "broker_id", "url",
                                                          "slave_id", "reason", "why",
                                                          "previous_epoch", "previous_master",
                                                          "lag_bytes"}

and a member that follows a new epoch and cut a divergent tail (an old master rejoining as a
slave) writes a child ``truncated-slave{k}`` with the bytes it moved aside per partition.

These records are history for people (the console's failover page), never an input of an
election: nothing here decides who leads. So they are written best-effort and off the
critical path: as a background task after the broker serves, failures logged once and
dropped, never delaying or failing a takeover. They are what a broker reported about
itself, so readers check them against the group's epoch history (metaq/console/collector.py).

``lag_bytes`` is how far behind the old master the new one was as it last knew: the sum over
its followed partitions of the master's log end (the freshest of the last fetch reply and the
last heartbeat) minus its own log end when it stopped following. 0 for a planned hand-over
(it waited to catch up) and in sync mode for every acked message; ``None`` for a first master.

Growth is bounded: every write keeps the newest ``KEEP_RECORDS`` epochs and deletes older ones.
With security on, the broker's ZooKeeper client creates nodes with the group's ACL by default
(metaq/zk/acl.py: anyone reads, only the group's brokers write), as for its other nodes.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from ..zk.group import ZK_CALL_TIMEOUT_S
from ..zk.paths import ZkPaths

log = logging.getLogger(__name__)

#: Epoch records kept per group (older ones are deleted as a new one is written).
KEEP_RECORDS = 100
TRUNCATED_PREFIX = "truncated-slave"

#: Why a broker became master, as recorded (``reason``), with the words shown beside it.
REASONS = {
    "first_master": "first master of the group",
    "session_expiry": "the old master's ZooKeeper session expired",
    "fast_takeover": "fast takeover: the old master's process died",
    "planned": "planned hand-over (metaq promote)",
    "unclean": "unclean election (metaq promote --unclean)",
    "reseed": "re-seeded after ZooKeeper lost the group's data",
}


def now_ms() -> int:
    return int(time.time() * 1000)


def write_takeover(client: KazooClient, paths: ZkPaths, broker_id: int, record: dict[str, Any]) -> None:
    """Create the record of ``record["epoch"]`` (a member's truncation child may have created
    its node empty first: then fill it), then prune to the newest ``KEEP_RECORDS``."""
    path = paths.failover(broker_id, int(record["epoch"]))
    data = _encode(record)
    try:
        client.create_async(path, data, makepath=True).get(timeout=ZK_CALL_TIMEOUT_S)
    except NodeExistsError:
        existing, stat = client.get_async(path).get(timeout=ZK_CALL_TIMEOUT_S)
        if existing:
            return  # written already (this epoch's lead was entered again, e.g. after a fence)
        client.set_async(path, data, version=stat.version).get(timeout=ZK_CALL_TIMEOUT_S)
    prune(client, paths, broker_id)


def write_truncation(client: KazooClient, paths: ZkPaths, broker_id: int, epoch: int, slave_id: int,
                     record: dict[str, Any]) -> None:
    """The bytes a member cut per partition as it followed ``epoch`` (its epoch's node made if
    missing). Following the same epoch again (a restart) adds what that pass cut: bytes are
    moved aside once, so the sums are what the member lost in this epoch in all."""
    path = f"{paths.failover(broker_id, epoch)}/{TRUNCATED_PREFIX}{slave_id}"
    try:
        client.create_async(path, _encode(record), makepath=True).get(timeout=ZK_CALL_TIMEOUT_S)
        return
    except NodeExistsError:
        pass
    data, stat = client.get_async(path).get(timeout=ZK_CALL_TIMEOUT_S)
    before = _parse(data, path, [])
    merged = dict(before.get("partitions") or {})
    for name, cut in record["partitions"].items():
        merged[name] = int(merged.get(name, 0)) + int(cut)
    client.set_async(path, _encode({**record, "partitions": merged}), version=stat.version).get(timeout=ZK_CALL_TIMEOUT_S)


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


def prune(client: KazooClient, paths: ZkPaths, broker_id: int, keep: int = KEEP_RECORDS) -> int:
    """Delete all but the newest ``keep`` epoch records; returns how many went."""
    parent = paths.failovers(broker_id)
    try:
        children = client.get_children_async(parent).get(timeout=ZK_CALL_TIMEOUT_S)
    except NoNodeError:
        return 0
    old = sorted(c for c in children if c.isdigit())[:-keep] if keep > 0 else sorted(children)
    for child in old:
        try:
            client.delete(f"{parent}/{child}", recursive=True)
        except NoNodeError:
            pass  # pruned by another member at the same time
    return len(old)


def read_records(client: KazooClient, paths: ZkPaths, broker_id: int) -> dict[int, dict[str, Any]]:
    """Every epoch record of a group, by the epoch its node is named after: the record as
    written (``{}`` if only a truncation child made it), its ``truncated`` children by slave
    id, and ``malformed`` naming what did not parse. Unchecked: callers compare with the
    group's epoch history."""
    parent = paths.failovers(broker_id)
    try:
        children = client.get_children(parent)
    except NoNodeError:
        return {}
    out: dict[int, dict[str, Any]] = {}
    for child in sorted(c for c in children if c.isdigit()):
        path = f"{parent}/{child}"
        entry: dict[str, Any] = {"record": {}, "truncated": {}, "malformed": []}
        try:
            data, _stat = client.get(path)
            kids = client.get_children(path)
        except NoNodeError:
            continue
        entry["record"] = _parse(data, path, entry["malformed"])
        for kid in kids:
            if not kid.startswith(TRUNCATED_PREFIX) or not kid[len(TRUNCATED_PREFIX):].isdigit():
                continue
            try:
                kid_data, _ = client.get(f"{path}/{kid}")
            except NoNodeError:
                continue
            entry["truncated"][int(kid[len(TRUNCATED_PREFIX):])] = _parse(kid_data, f"{path}/{kid}", entry["malformed"])
        out[int(child)] = entry
    return out


def _parse(data: bytes, path: str, malformed: list[str]) -> dict[str, Any]:
    if not data:
        return {}
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        malformed.append(path)
        return {}
    return value
