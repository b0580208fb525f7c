"""The ZooKeeper layout, in one place, plus the value formats stored in it.

Every component (broker registry, HA, clients, `metaq cluster`) builds its paths here so
that the layout is defined once. The root is ``zk.zkRoot`` (MetaQ's default ``/meta``);
tests give each case its own root so that many cases can share one ZooKeeper server.

    {root}/brokers/ids/{id}                          persistent parent (master url for old clients)
    {root}/brokers/ids/{id}/master                   ephemeral  meta://host:port
    {root}/brokers/ids/{id}/slave{k}                 ephemeral  meta://host:port
    {root}/brokers/ids/{id}/master_config_checksum   ephemeral  CRC32 of server.ini, decimal
    {root}/brokers/ids/{id}/epoch                    persistent current master epoch (CAS only)
    {root}/brokers/ids/{id}/sync_set                 the slaves counted for sync acks
    {root}/brokers/topic-config/{id}                 persistent the group's topic configuration (JSON)
    {root}/brokers/ids/{id}/candidates/slave{k}      ephemeral  an orphaned slave's log end (async election)
    {root}/brokers/ids/{id}/handover                 persistent `metaq promote`: the one slave that may take over
    {root}/brokers/ids/{id}/producer_ids             persistent next free producer id block (CAS; metaq/server/producer_ids.py)
    {root}/brokers/ids/{id}/failovers/{epoch:010d}   persistent what the master of {epoch} said of its takeover (JSON; metaq/ha/failover_record.py)
    {root}/brokers/ids/{id}/failovers/{epoch:010d}/truncated-slave{k}  persistent bytes a rejoining member cut (JSON)
    {root}/brokers/topics-pub/{topic}/{id}-m         ephemeral  {"numParts":N,"broker":"0-m"}
    {root}/brokers/topics-sub/{topic}/{id}-m|-s{k}   ephemeral  same JSON
    {root}/consumers/{group}/ids/{group}_{cid}       ephemeral  comma-separated topics
    {root}/consumers/{group}/owners/{topic}/{part}   ephemeral  owning consumer id
    {root}/consumers/{group}/offsets/{topic}/{part}  persistent "{msgId}-{offset}"
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# MetaQ's offset value when no message id is known (and what a pre-1.4 bare offset means).
NO_MSG_ID = -1


def _join(*parts: str) -> str:
    return "/".join(parts)


class ZkPaths:
    """Path builder for one root; methods are named after the node they return."""

    def __init__(self, root: str = "/meta") -> None:
        if not root.startswith("/"):
            raise ValueError(f"ZooKeeper root must start with '/', got {root!r}")
        # "/" as root would otherwise produce "//brokers".
        self.root = root.rstrip("/") or ""

    def __repr__(self) -> str:
        return f"ZkPaths({self.root or '/'!r})"

    # --- brokers ---------------------------------------------------------------

    def brokers(self) -> str:
        return f"{self.root}/brokers"

    def broker_ids(self) -> str:
        return f"{self.root}/brokers/ids"

    def broker(self, broker_id: int) -> str:
        return _join(self.broker_ids(), str(broker_id))

    def master(self, broker_id: int) -> str:
        return _join(self.broker(broker_id), "master")

    def slave(self, broker_id: int, slave_id: int) -> str:
        return _join(self.broker(broker_id), f"slave{slave_id}")

    def master_config_checksum(self, broker_id: int) -> str:
        return _join(self.broker(broker_id), "master_config_checksum")

    def epoch(self, broker_id: int) -> str:
        return _join(self.broker(broker_id), "epoch")

    def sync_set(self, broker_id: int) -> str:
        return _join(self.broker(broker_id), "sync_set")

    def topic_config(self, broker_id: int) -> str:
        """A broker group's shared topic configuration (metaq/zk/topic_config.py)."""
        return f"{self.root}/brokers/topic-config/{broker_id}"

    def producer_ids(self, broker_id: int) -> str:
        """The group's producer id counter (metaq/server/producer_ids.py)."""
        return _join(self.broker(broker_id), "producer_ids")

    def handover(self, broker_id: int) -> str:
        return _join(self.broker(broker_id), "handover")

    def failovers(self, broker_id: int) -> str:
        """The group's takeover records (metaq/ha/failover_record.py), one child per epoch."""
        return _join(self.broker(broker_id), "failovers")

    def failover(self, broker_id: int, epoch: int) -> str:
        # Zero-padded: the children sort by name in epoch order (pruning keeps the newest).
        return _join(self.failovers(broker_id), f"{epoch:010d}")

    def candidates(self, broker_id: int) -> str:
        return _join(self.broker(broker_id), "candidates")

    def candidate(self, broker_id: int, slave_id: int) -> str:
        return _join(self.candidates(broker_id), f"slave{slave_id}")

    def reseed_claims(self, broker_id: int) -> str:
        return _join(self.broker(broker_id), "reseed")

    def reseed_claim(self, broker_id: int, identity: str) -> str:
        return _join(self.reseed_claims(broker_id), identity)

    # --- topics ----------------------------------------------------------------

    def topics_pub(self, topic: str | None = None) -> str:
        base = f"{self.root}/brokers/topics-pub"
        return base if topic is None else _join(base, topic)

    def topics_sub(self, topic: str | None = None) -> str:
        base = f"{self.root}/brokers/topics-sub"
        return base if topic is None else _join(base, topic)

    def topic_pub_node(self, topic: str, broker_id: int, slave_id: int | None = None) -> str:
        return _join(self.topics_pub(topic), broker_node_name(broker_id, slave_id))

    def topic_sub_node(self, topic: str, broker_id: int, slave_id: int | None = None) -> str:
        return _join(self.topics_sub(topic), broker_node_name(broker_id, slave_id))

    # --- consumers -------------------------------------------------------------

    def consumers(self) -> str:
        return f"{self.root}/consumers"

    def consumer_group(self, group: str) -> str:
        return _join(self.consumers(), group)

    def consumer_ids(self, group: str) -> str:
        return _join(self.consumer_group(group), "ids")

    def consumer_id(self, group: str, consumer_id: str) -> str:
        # MetaQ names the node "{group}_{consumerId}".
        return _join(self.consumer_ids(group), f"{group}_{consumer_id}")

    def owners(self, group: str, topic: str) -> str:
        return _join(self.consumer_group(group), "owners", topic)

    def owner(self, group: str, topic: str, partition_name: str) -> str:
        return _join(self.owners(group, topic), partition_name)

    def offsets(self, group: str, topic: str) -> str:
        return _join(self.consumer_group(group), "offsets", topic)

    def offset(self, group: str, topic: str, partition_name: str) -> str:
        return _join(self.offsets(group, topic), partition_name)


# --- broker node names ---------------------------------------------------------


def slave_node_id(name: str) -> int | None:
    """``slave3`` -> 3 for a child of ``/brokers/ids/{id}``; None for any other child."""
    if name.startswith("slave") and name[5:].isdigit():
        return int(name[5:])
    return None


def broker_node_name(broker_id: int, slave_id: int | None = None) -> str:
    """``0-m`` for a master, ``0-s1`` for slave 1 of broker 0 (topic nodes, JSON "broker")."""
    return f"{broker_id}-m" if slave_id is None else f"{broker_id}-s{slave_id}"


def parse_broker_node_name(name: str) -> tuple[int, int | None]:
    """Inverse of broker_node_name: ``"0-s1"`` -> ``(0, 1)``, ``"3-m"`` -> ``(3, None)``."""
    broker, sep, role = name.rpartition("-")
    try:
        if sep and role == "m":
            return int(broker), None
        if sep and role.startswith("s"):
            return int(broker), int(role[1:])
    except ValueError:
        pass
    raise ValueError(f"not a broker node name (expected 'ID-m' or 'ID-sK'): {name!r}")


def partition_name(broker_id: int, partition: int) -> str:
    """A partition's global name, the same on a master and all its slaves."""
    return f"{broker_id}-{partition}"


# --- topic node data -------------------------------------------------------------


@dataclass(frozen=True)
class TopicNodeData:
    num_parts: int
    broker_id: int
    slave_id: int | None = None


def topic_node_data(num_parts: int, broker_id: int, slave_id: int | None = None) -> bytes:
    """The JSON MetaQ stores in topics-pub / topics-sub nodes, e.g. ``{"numParts":4,"broker":"0-m"}``."""
    payload = {"numParts": num_parts, "broker": broker_node_name(broker_id, slave_id)}
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def parse_topic_node_data(data: bytes | str) -> TopicNodeData:
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        payload = json.loads(text)
        num_parts = int(payload["numParts"])
        broker_id, slave_id = parse_broker_node_name(str(payload["broker"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"bad topic node data {text!r}: {exc}") from None
    return TopicNodeData(num_parts, broker_id, slave_id)


# --- consumer offsets --------------------------------------------------------------


def format_offset(msg_id: int, offset: int) -> str:
    return f"{msg_id}-{offset}"


def parse_offset(text: str | bytes) -> tuple[int, int]:
    """``"{msgId}-{offset}"`` -> ``(msg_id, offset)``, splitting on the LAST '-' like MetaQ.

    So ``"-1-0"`` is msg id -1 at offset 0, and a pre-1.4 bare ``"123"`` is offset 123
    with no message id (-1).
    """
    value = (text.decode("utf-8") if isinstance(text, bytes) else text).strip()
    head, sep, tail = value.rpartition("-")
    try:
        if not sep or not head:
            # No separator, or only a leading sign: a bare offset.
            offset = int(value)
            msg_id = NO_MSG_ID
        else:
            msg_id, offset = int(head), int(tail)
    except ValueError:
        raise ValueError(f"bad consumer offset {value!r} (expected 'msgId-offset')") from None
    if offset < 0:
        raise ValueError(f"bad consumer offset {value!r}: negative offset")
    return msg_id, offset


# --- a group's epoch and sync set ----------------------------------------------------


def encode_epoch(epoch: int, leader_url: str, leader_identity: str | None = None) -> bytes:
    """The epoch node's value: ``{"epoch": N, "leader": url, "identity": id}`` (the master that
    took epoch N; ``identity`` is the broker's stable identity from its data dir, which a
    restart on another address keeps)."""
    value: dict[str, object] = {"epoch": epoch, "leader": leader_url}
    if leader_identity is not None:
        value["identity"] = leader_identity
    return json.dumps(value).encode()


def decode_epoch_identity(data: bytes) -> str | None:
    """The leader identity in an epoch node's value, or None (older values have none)."""
    text = data.decode("utf-8").strip()
    if not text.startswith("{"):
        return None
    try:
        identity = json.loads(text).get("identity")
    except ValueError:
        return None
    return identity if isinstance(identity, str) else None


def decode_epoch(data: bytes) -> tuple[int, str | None]:
    """``(epoch, leader url or None)``; an old bare number is an epoch without a leader."""
    text = data.decode("utf-8").strip()
    try:
        if text.startswith("{"):
            value = json.loads(text)
            return int(value["epoch"]), value.get("leader")
        return int(text or 0), None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"bad epoch node value {text!r}: {exc}") from None


def encode_sync_set(members: frozenset[int], epoch: int, min_sync_slaves: int) -> bytes:
    """The sync_set node's value: the slaves counted for sync acks, and the epoch that chose them."""
    return json.dumps({"slaves": sorted(members), "epoch": epoch, "min_sync_slaves": min_sync_slaves}).encode()


def decode_sync_set(data: bytes) -> tuple[frozenset[int], int]:
    """``(slave ids, epoch)`` of a sync_set node value."""
    text = data.decode("utf-8")
    try:
        value = json.loads(text)
        return frozenset(int(s) for s in value.get("slaves", [])), int(value.get("epoch", 0))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"bad sync_set node value {text!r}: {exc}") from None
