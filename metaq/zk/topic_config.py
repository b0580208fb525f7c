"""A broker group's topic configuration in ZooKeeper: what every member of the group serves.

One persistent node per group, ``{root}/brokers/topic-config/{id}``, JSON::

    {"topics": {"audit": {"numPartitions": "3", "unflushThreshold": "7"}}, "deleted": ["old"],
     "incarnations": {"audit": "5f0c…"}}

Values are server.ini text under MetaQ's key names (``config.SHARED_TOPIC_KEYS``); a
key a topic leaves out takes the applying broker's ``[system]`` default. ``dataPath``
is never shared: each broker keeps its topics on its own disk.

Precedence (one rule, applied by ``serve_group_topics``): once the node exists, every
member of the group, master or slave, serves exactly the topics it names with its
settings; ``server.ini``'s topic sections only seed it. A broker started without
``--slave`` while no other broker leads the group adds each of its server.ini topics
that the node does not name yet (and that no ``metaq topics delete`` removed), so the
MetaQ way, a topic section in the master's server.ini, still works; it never changes or
removes a topic the node has. One joining a group another broker leads never seeds
(metaq/ha/joining.py).
``metaq topics create|alter|delete`` and a SIGHUP'd server.ini edit change it.

Only per-topic overrides are stored: a seeded section contributes its
``numPartitions`` and the keys whose values differ from the seeding broker's
``[system]`` defaults; a SIGHUP'd edit changes only the keys the edit changed, and a
key whose new value is the new ``[system]`` default is removed (inherited again). So
a ``[system]`` edit (``unflushInterval``, say) applies to every topic that does not
override the key, never pinning its old or new value on some topics and not others;
``metaq topics alter --set KEY=`` removes an override.

Incarnations (Kafka's topic ids): every ``create`` of a name (``with_topic`` of a name the
node does not have) gets a new random id under ``incarnations``; ``alter`` keeps it; a seed
or a SIGHUP'd section never makes one (a server.ini section has none; a member writing back
what it serves keeps its ids), so nothing but an operator's create can make members drop files. A
broker keeps it beside each partition's files and drops a partition whose files belong to
another incarnation (metaq/store/manager.py), so a re-created topic starts empty on every
member, also on one that was down during the delete. A topic written before incarnations
existed has none ("") and keeps its files.

Every write is a compare-and-set on the node's version, so two writers never lose
each other's change.

Size: ZooKeeper refuses a node bigger than ``jute.maxbuffer`` (1 MiB by default), and a client
sending one only sees its connection dropped. The JSON costs ~110 bytes a topic, so 10,000
topics of one partition pass that. A value whose JSON is over ``PLAIN_MAX_BYTES`` is stored
zlib-compressed behind ``COMPRESSED_PREFIX`` (4x smaller at 10,000 topics: 255 KB; the
incarnation ids are random), so
one node, and with it the one compare-and-set, holds the whole configuration; smaller ones stay
plain JSON, as earlier versions wrote and read them. One that would still pass
``MAX_NODE_BYTES`` is refused before it is written (``TopicConfigTooLarge``, one line).
"""

from __future__ import annotations

import json
import logging
import uuid
import zlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from ..errors import MetaqError
from ..config import (
    SHARED_TOPIC_KEYS,
    BrokerConfig,
    ConfigError,
    TopicConfig,
    setting_text,
    topic_from_settings,
    topic_settings,
)
from .paths import ZkPaths, partition_name

if TYPE_CHECKING:
    from .acl import ZkSecurity

log = logging.getLogger(__name__)

#: How long one ZooKeeper call may take.
ZK_CALL_TIMEOUT_S = 5.0
#: A value whose JSON is longer is stored compressed (shorter ones stay readable by any version).
PLAIN_MAX_BYTES = 256 * 1024
COMPRESSED_PREFIX = b"zlib:"
#: The most a value may take in ZooKeeper: under jute.maxbuffer's 1 MiB default, with room
#: for the request's own bytes.
MAX_NODE_BYTES = 1_000_000


class TopicConfigTooLarge(MetaqError):
    """The group's topic configuration would not fit in one ZooKeeper node."""


@dataclass(frozen=True)
class GroupTopics:
    """The decoded node: topic -> settings (MetaQ keys, text), and the names deleted by operators."""

    topics: dict[str, dict[str, str]] = field(default_factory=dict)
    deleted: frozenset[str] = frozenset()
    #: topic -> the id of its current life (absent: a topic from before incarnations).
    incarnations: dict[str, str] = field(default_factory=dict)
    #: The node's version (-1: the node does not exist yet).
    version: int = -1

    @property
    def exists(self) -> bool:
        return self.version >= 0

    def encode(self) -> bytes:
        value: dict[str, object] = {
            "topics": {name: dict(sorted(s.items())) for name, s in sorted(self.topics.items())},
            "deleted": sorted(self.deleted),
        }
        if self.incarnations:
            value["incarnations"] = dict(sorted(self.incarnations.items()))
        plain = json.dumps(value, separators=(",", ":")).encode()
        if len(plain) <= PLAIN_MAX_BYTES:
            return plain
        packed = COMPRESSED_PREFIX + zlib.compress(plain, 6)
        if len(packed) > MAX_NODE_BYTES:
            raise TopicConfigTooLarge(
                f"the topic configuration of {len(self.topics)} topics ({len(self.deleted)} deleted names kept) would take"
                f" {len(packed)} bytes in ZooKeeper even compressed, over the {MAX_NODE_BYTES} a node may hold"
                f" (jute.maxbuffer): use fewer topics with more partitions each")
        return packed

    def with_topic(self, name: str, settings: dict[str, str], incarnation: str | None = None) -> "GroupTopics":
        """The topic with these settings. Its incarnation: ``incarnation`` if given ("": none,
        a seed from server.ini); else a new one if the node does not have the name (a create),
        else the same one (an alter)."""
        topics = dict(self.topics)
        incarnations = dict(self.incarnations)
        if incarnation is not None:
            incarnations.pop(name, None)
            if incarnation:
                incarnations[name] = incarnation
        elif name not in topics:
            incarnations[name] = uuid.uuid4().hex
        topics[name] = dict(settings)
        return replace(self, topics=topics, deleted=self.deleted - {name}, incarnations=incarnations)

    def without_topic(self, name: str) -> "GroupTopics":
        topics = dict(self.topics)
        topics.pop(name, None)
        incarnations = {topic: id_ for topic, id_ in self.incarnations.items() if topic != name}
        return replace(self, topics=topics, deleted=self.deleted | {name}, incarnations=incarnations)


def decode_group_topics(data: bytes, version: int) -> GroupTopics:
    if data.startswith(COMPRESSED_PREFIX):
        try:
            data = zlib.decompress(data[len(COMPRESSED_PREFIX):])
        except zlib.error as exc:
            raise ValueError(f"bad topic configuration node value: compressed, but {exc}") from None
    text = data.decode("utf-8", "replace")
    try:
        value = json.loads(text) if text.strip() else {}
        topics = {str(name): {str(k): setting_text(v) for k, v in settings.items()} for name, settings in value.get("topics", {}).items()}
        deleted = frozenset(str(name) for name in value.get("deleted", []))
        # Only for topics the node names: an id is a directory marker, never a directory name.
        incarnations = {str(name): str(id_) for name, id_ in value.get("incarnations", {}).items() if str(name) in topics}
    except (ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"bad topic configuration node value {text[:200]!r}: {exc}") from None
    for name, id_ in incarnations.items():
        if not id_.isalnum() or len(id_) > 64:
            raise ValueError(f"bad topic configuration node value: topic {name}: incarnation {id_[:70]!r} is not 1-64 letters and digits")
    return GroupTopics(topics, deleted, incarnations, version)


def read_group_topics(client: KazooClient, paths: ZkPaths, broker_id: int, timeout: float = ZK_CALL_TIMEOUT_S) -> GroupTopics:
    try:
        data, stat = client.get_async(paths.topic_config(broker_id)).get(timeout=timeout)
    except NoNodeError:
        return GroupTopics()
    return decode_group_topics(data, stat.version)


def update_group_topics(
    client: KazooClient,
    paths: ZkPaths,
    broker_id: int,
    change: Callable[[GroupTopics], GroupTopics | None],
    attempts: int = 20,
    security: "ZkSecurity | None" = None,
) -> GroupTopics:
    """Apply ``change`` by compare-and-set, retrying on a concurrent write.

    ``change`` returns the new value, or None to leave the node as it is. Returns what
    the node holds afterwards (with its new version). With ``security`` (ZooKeeper ACLs
    on), a node created here and its missing directory get their own ACLs (zk/acl.py).
    """
    path = paths.topic_config(broker_id)
    for _ in range(attempts):
        current = read_group_topics(client, paths, broker_id)
        wanted = change(current)
        if wanted is None or (wanted.exists and wanted.encode() == current.encode()):
            return current
        try:
            if current.exists:
                stat = client.set_async(path, wanted.encode(), version=current.version).get(timeout=ZK_CALL_TIMEOUT_S)
                return replace(wanted, version=stat.version)
            if security is not None:
                security.ensure_parents(client, path)
                client.create_async(path, wanted.encode(), acl=security.acl_for(path)).get(timeout=ZK_CALL_TIMEOUT_S)
            else:
                client.create_async(path, wanted.encode(), makepath=True).get(timeout=ZK_CALL_TIMEOUT_S)
            return replace(wanted, version=0)
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue  # someone else wrote first: look again
    raise RuntimeError(f"{path}: too many concurrent writers; try again")


# --- what a broker does with it -------------------------------------------------------------


def topic_overrides(topic: TopicConfig, defaults: TopicConfig) -> dict[str, str]:
    """What a server.ini topic section adds to the group: its partitions, and every key
    whose value differs from ``defaults`` (the broker's ``[system]`` topic defaults)."""
    inherited = topic_settings(defaults)
    own = topic_settings(topic)
    return {key: value for key, value in own.items() if key == "numPartitions" or value != inherited[key]}


def seed_with(local: dict[str, TopicConfig], defaults: TopicConfig) -> Callable[[GroupTopics], GroupTopics | None]:
    """A change adding each local topic the group does not name yet and no operator deleted."""

    def change(group: GroupTopics) -> GroupTopics | None:
        added = {name: topic for name, topic in local.items() if name not in group.topics and name not in group.deleted}
        if not added and group.exists:
            return None
        result = replace(group, version=max(group.version, 0))
        for name, topic in added.items():
            # Invariant: a seed never starts a new incarnation. A server.ini section has none
            # (""; its files are kept whatever their marker); the topics a member serves, written
            # back after ZooKeeper lost the node, keep theirs, or every member would drop its files.
            result = result.with_topic(name, topic_overrides(topic, defaults), incarnation=topic.incarnation)
        return result

    return change


def publish_with(
    edits: dict[str, tuple[TopicConfig | None, TopicConfig]], defaults: TopicConfig
) -> Callable[[GroupTopics], GroupTopics | None]:
    """A change writing what an operator's server.ini edit changed: ``edits`` maps a topic to
    its section ``(before, after)`` (before None: a new section), ``defaults`` are the
    broker's ``[system]`` topic defaults after the edit.

    Only the keys the edit changed are written, so an override set by ``metaq topics
    alter`` on another key stays; a changed key now equal to its default is removed.
    """
    inherited = topic_settings(defaults)

    def change(group: GroupTopics) -> GroupTopics | None:
        result = replace(group, version=max(group.version, 0))
        for name, (before, after) in edits.items():
            if before is None or name not in group.topics:
                # A section is no create: no new incarnation (see seed_with).
                result = result.with_topic(name, topic_overrides(after, defaults), incarnation=after.incarnation)
                continue
            old, new = topic_settings(before), topic_settings(after)
            settings = dict(group.topics[name])
            for key, value in new.items():
                if value == old[key]:
                    continue
                if value == inherited[key] and key != "numPartitions":
                    settings.pop(key, None)
                else:
                    settings[key] = value
            result = result.with_topic(name, settings)
        return result

    return change


def serve_group_topics(own: BrokerConfig, local: dict[str, TopicConfig], group: GroupTopics, where: str) -> dict[str, TopicConfig]:
    """The topic map a member serves: the group's topics over its own defaults and dataPath.

    ``local`` is the broker's own server.ini topics (a topic section's dataPath stays the
    broker's). Raises ConfigError (naming ``where``) on a value the parsers refuse.
    """
    served: dict[str, TopicConfig] = {}
    for name, settings in sorted(group.topics.items()):
        data_path = local[name].data_path if name in local else own.topic_defaults.data_path
        topic = topic_from_settings(replace(own.topic_defaults, data_path=data_path), name, settings, where)
        served[name] = replace(topic, incarnation=group.incarnations.get(name, ""))
    return served


def delete_group_offsets(client: KazooClient, paths: ZkPaths, broker_id: int, topic: str) -> list[str]:
    """Delete every consumer group's stored offsets of ``topic``'s partitions in broker group
    ``broker_id`` (``{root}/consumers/{group}/offsets/{topic}/{id}-{n}``); the paths deleted.

    Kafka's rule for a deleted topic: its committed offsets go with it. A group then has no
    stored offset for the re-created topic and starts where any new group does (its oldest
    message, or the newest with ``consume_from_max_offset``), never at an offset of the old
    one. Best effort per node: one that cannot be deleted is logged and kept.
    """
    prefix = partition_name(broker_id, 0)[:-1]  # "{id}-"
    deleted = []
    try:
        groups = client.get_children(paths.consumers())
    except NoNodeError:
        return deleted
    for group in groups:
        try:
            names = client.get_children(paths.offsets(group, topic))
        except NoNodeError:
            continue
        for name in names:
            if not name.startswith(prefix) or not name[len(prefix):].isdigit():
                continue  # another broker group's partition: its master deletes it
            path = paths.offset(group, topic, name)
            try:
                client.delete(path)
                deleted.append(path)
            except NoNodeError:
                pass
            except KazooException as exc:
                log.warning("could not delete the stored offset %s of deleted topic %s: %r", path, topic, exc)
    return deleted


def check_settings(settings: dict[str, str], where: str = "topic settings") -> None:
    """ConfigError unless every key is a shared topic key with a valid value."""
    unknown = [key for key in settings if key not in SHARED_TOPIC_KEYS]
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]}: not a shared topic key (one of {', '.join(SHARED_TOPIC_KEYS)})")
    topic_from_settings(TopicConfig(name=""), "", settings, where)
