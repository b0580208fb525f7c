"""Config auto-sync: a slave adopts its master's topic sections.

The master publishes the CRC32 of its server.ini in ZooKeeper
(``/brokers/ids/{id}/master_config_checksum``). When it changes, a slave with
``autoSyncMasterConfig=true`` fetches the file over the protocol (``config``)
and adopts the master's ``[topic=...]`` sections: new topics, changed partition
counts, per-topic flush and retention settings. Its identity stays its own:
``brokerId``, ``hostName``, ``serverPort``, ``dataPath`` and the ZooKeeper
section are never taken from the master, and a topic's ``dataPath`` is the
slave's (the master's paths mean nothing on the slave's disk).

Unlike MetaQ, the slave's own server.ini is not overwritten: the master's copy
is kept beside it as ``{server.ini}.master`` for operators, and applied in
memory; a restarted slave syncs again on start.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from ..config import BrokerConfig, TopicConfig, parse_server_ini

log = logging.getLogger(__name__)


def adopt_master_topics(own: BrokerConfig, master_ini: bytes, master_source: str = "master server.ini") -> dict[str, TopicConfig]:
    """The slave's topic map after adopting the master's topic sections."""
    master = parse_server_ini(master_ini, master_source)
    merged = dict(own.topics)
    for name, topic in master.topics.items():
        own_topic = own.topics.get(name)
        data_path = own_topic.data_path if own_topic is not None else own.data_path
        merged[name] = replace(topic, data_path=data_path)
    return merged


def topics_for_master_layout(own: BrokerConfig, master_topics: dict[str, int]) -> dict[str, TopicConfig]:
    """Without auto-sync: replicate the master's topics with the slave's own settings.

    A master topic the slave's config does not name gets the slave's ``[system]``
    defaults; the partition count is always the master's (the logs must match).
    """
    template = own.topic_defaults
    merged = dict(own.topics)
    for name, partitions in master_topics.items():
        base = own.topics.get(name) or replace(template, name=name)
        merged[name] = replace(base, num_partitions=max(partitions, 1))
    return merged


def save_master_copy(own: BrokerConfig, master_ini: bytes) -> Path | None:
    if not own.source_path:
        return None
    target = Path(own.source_path + ".master")
    try:
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_bytes(master_ini)
        tmp.replace(target)
    except OSError as exc:
        log.warning("could not keep a copy of the master's config at %s: %s", target, exc)
        return None
    return target
