"""May this broker join its group as started? Checked once, before it takes part in HA.

A broker id names a group; a second broker started with an id already in use must
not silently become a slave and drop its own topics (a slave serves its master's
topics), nor wait forever for a slave id another broker holds. So, before the HA
coordinator starts:

* started with ``--slave`` (slave id ``k``): if ``slave{k}`` is registered by another
  broker (another url) and does not go within the session timeout (a previous run
  of this broker on another address would expire by then), refuse;
* started without ``--slave`` while another broker is the registered master (not
  this broker's previous run, recognised by the identity kept in its data dir), it
  joins as a slave and never changes the group's topics (``check_join`` returns True:
  it does not seed the group's topic configuration, zk/topic_config.py):

  - a former member (its logs carry the group's epoch history: the old master back
    after a failover) joins with a WARNING; once the group keeps its topics in
    ZooKeeper it serves those, and the WARNING names its server.ini topics the group
    lacks or has with another partition count (not served here; their files stay on
    disk; `metaq topics create|alter` adds them to the group). Adding topics to a group
    by starting an old member would be a surprise, and refusing it would keep a replica
    of every other topic out of the group for one section of its server.ini;
  - a broker that never was a member, with a topic the group (or, without a topic
    configuration in ZooKeeper, the master) lacks or has with another partition count,
    is refused: it was most likely given a brokerId in use by mistake, and joining would
    silently stop serving its topics. Otherwise it joins with a WARNING.

A refusal is a ``JoinRefused`` (a ConfigError): the broker exits with one line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ..config import BrokerConfig, ConfigError, SlaveConfig
from ..zk.group import ZK_CALL_TIMEOUT_S, read_group_state
from ..zk.paths import ZkPaths
from ..zk.topic_config import read_group_topics, serve_group_topics
from .epochs import FILE_NAME as EPOCHS_FILE
from .epochs import EpochCache
from .host import BrokerHost
from .peers import peer_topics

log = logging.getLogger(__name__)


class JoinRefused(ConfigError):
    """This broker would take a place in its group that another broker holds."""


async def check_join(host: BrokerHost, slave: SlaveConfig | None, identity: str) -> bool:
    """Raise JoinRefused, or return whether this broker joins a group another broker leads
    (then it must not seed the group's topics; see the module docstring)."""
    config, zk, my_url = host.config, host.registry.client, host.registry.url
    paths = ZkPaths(config.zk.root)
    group = config.broker_id
    if slave is not None:
        await _check_slave_id_free(config, slave.slave_id, zk, paths, my_url)
        return True
    state = await asyncio.to_thread(read_group_state, zk, paths, group)
    master = state.master_url
    if master is None or master == my_url:
        return False
    if state.leader_url == master and state.leader_identity == identity:
        return False  # our own previous run on another address: the coordinator waits for it to expire
    group_topics = await asyncio.to_thread(read_group_topics, zk, paths, group)
    # Once the group keeps its topic configuration in ZooKeeper, that is what every member serves.
    seeded = group_topics.exists
    if seeded:
        served = serve_group_topics(config, config.topics, group_topics, f"{paths.topic_config(group)}")
        master_topics: dict[str, int] | None = {name: topic.num_partitions for name, topic in served.items()}
    else:
        # As a member of the group (peers.py): with security on, an anonymous ask is refused
        # and the check would be skipped as if the master did not answer.
        master_topics = await peer_topics(host, master, None)
    if master_topics is None:
        log.warning(
            "broker group %d already has a master at %s (epoch %d) that does not answer; this broker was"
            " started without --slave and will follow whoever leads", group, master, state.epoch,
        )
        return True
    there = "in the group's topic configuration" if seeded else "on the master"
    missing = sorted(t for t in config.topics if t not in master_topics)
    differing = sorted(
        f"{t} (numPartitions {c.num_partitions} here, {master_topics[t]} {there})"
        for t, c in config.topics.items() if t in master_topics and master_topics[t] != c.num_partitions
    )
    what = "; ".join(filter(None, [
        f"topics not {there}: {', '.join(missing)}" if missing else "",
        "; ".join(differing),
    ]))
    if what and seeded and _has_been_member(config):
        # A former member joins as it always did, and the group's topics stay as they are.
        log.warning(
            "broker group %d already has a master at %s (epoch %d): this broker, a former member started"
            " without --slave, joins it as a slave and serves the group's topics, not its server.ini's (%s;"
            " files of topics it does not serve stay on disk); to change the group's topics: `metaq topics create|alter`",
            group, master, state.epoch, what,
        )
        return True
    if what:
        raise JoinRefused(
            f"{config.source_path}: brokerId={group} is in use: its group already has a master at {master}"
            f" (epoch {state.epoch}); started without --slave, this broker would join as a slave and stop serving"
            f" its own {what}. Give it a free brokerId, or stop the other master, or add the topics to the master first"
        )
    log.warning(
        "broker group %d already has a master at %s (epoch %d): this broker was started without --slave and"
        " joins it as a slave (every topic it has is served by the master)", group, master, state.epoch,
    )
    return True


async def _check_slave_id_free(config: BrokerConfig, slave_id: int, zk: KazooClient, paths: ZkPaths, my_url: str) -> None:
    path = paths.slave(config.broker_id, slave_id)
    # A previous run of this broker (killed, perhaps on another address) holds it until
    # its session expires: wait that long before calling it another broker's.
    deadline = time.monotonic() + config.zk.session_timeout_ms / 1000 * 1.5 + 1
    while True:
        try:
            data, _ = await asyncio.to_thread(lambda: zk.get_async(path).get(timeout=ZK_CALL_TIMEOUT_S))
        except NoNodeError:
            return
        holder = data.decode("utf-8", "replace")
        if holder == my_url:
            return  # our own previous run at this address: the registry waits for it
        if time.monotonic() > deadline:
            raise JoinRefused(
                f"{config.source_path}: slaveId={slave_id} of brokerId={config.broker_id} is in use by {holder}:"
                " give this broker a free slaveId in its --slave properties, or stop the other slave"
            )
        await asyncio.sleep(0.2)


def _has_been_member(config: BrokerConfig) -> bool:
    """Whether this broker's logs carry an epoch history, i.e. it has led or followed its group."""
    for name, topic in config.topics.items():
        for partition in range(topic.num_partitions):
            directory = Path(topic.data_path) / f"{name}-{partition}"
            if (directory / EPOCHS_FILE).exists() and EpochCache.load(directory).entries:
                return True
    return False
