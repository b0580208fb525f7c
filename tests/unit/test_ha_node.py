"""The HA facade (metaq/ha/node.py): the one role answer, and a slave's position kept once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from metaq.config import SlaveConfig
from metaq.ha.epochs import EpochCache
from metaq.ha.node import HaNode
from metaq.ha.record import RecordTable
from metaq.ha.role import Role
from metaq.protocol import commands as c


class Log:
    log_end = flushed_end = 300


HOST = SimpleNamespace(config=SimpleNamespace(broker_id=2), registry=SimpleNamespace(slave_id=1))


def host() -> SimpleNamespace:
    """HOST with partitions of its own (each partition's replication record)."""
    return SimpleNamespace(config=HOST.config, registry=HOST.registry, partitions=RecordTable())


def node_in(state: Role, slave: SlaveConfig | None = None) -> HaNode:
    node = HaNode(host(), slave, in_zookeeper=True)
    node.coordinator = SimpleNamespace(
        state=state, epochs=SimpleNamespace(serving=4), master_url="m:1", may_ack=lambda: state is Role.LEADING,
        leadership=SimpleNamespace(sync_set=None, lease=None, handover_target=1), followership=SimpleNamespace(follower=None),
    )
    node.ready = True
    return node


def test_the_role_is_the_state_machines_not_the_start_flag() -> None:
    promoted = node_in(Role.LEADING, SlaveConfig(slave_id=1, slave_group="g"))
    assert promoted.role_name == "master" and promoted.acting_master and promoted.write_refusal() is None
    follower = node_in(Role.FOLLOWING)
    assert follower.role_name == "slave1" and not follower.acting_master
    assert follower.write_refusal()[0] == c.FORBIDDEN
    fenced = node_in(Role.FENCED)
    assert fenced.acting_master and fenced.write_refusal()[0] == c.SERVICE_UNAVAILABLE


def test_without_zookeeper_a_broker_is_a_standalone_master() -> None:
    node = HaNode(host(), None, in_zookeeper=False)
    assert node.role is Role.LEADING and node.epoch == 0 and node.epoch_end("t", 0, 1) is None
    assert node.write_refusal()[0] == c.SERVICE_UNAVAILABLE, "not ready before start"
    node.ready = True
    assert node.write_refusal() is None and node.committed("t", 0, Log()) == 300


def test_a_departed_slave_is_forgotten_once_its_last_connection_closes() -> None:
    node = node_in(Role.LEADING)
    first, second = object(), object()
    node.replica_fetched(3, 4, "t", 0, 120, first)
    node.replica_fetched(3, 4, "t", 0, 150, second)
    node.connection_closed(first)
    assert node.progress.position(3, "t", 0) == 150, "still replicating over another connection"
    node.connection_closed(second)
    assert node.progress.position(3, "t", 0) is None and node.progress.slaves == {}


def test_a_master_handing_over_refuses_writes_before_storing_anything() -> None:
    node = node_in(Role.HANDING_OVER)
    assert node.role_name == "master" and node.acting_master, "still the master its slaves fetch from"
    code, message = node.write_refusal()
    assert code == 503 and "handing over to slave 1" in message


def deposable_node(epochs: EpochCache, led_epoch: int) -> tuple[HaNode, SimpleNamespace]:
    """A node leading epoch ``led_epoch`` of partition t-0 (log end 300), whose follower (as
    after an earlier follow) serves a masterless partition's whole log."""
    leader = host()
    # Batches end at 100, 200, 300: a slave position inside one is cut to its start.
    leader.partitions.batch_boundary = lambda t, p, offset, fallback: offset - offset % 100
    node = HaNode(leader, None, in_zookeeper=True)
    coordinator = SimpleNamespace(
        state=Role.LEADING, epochs=SimpleNamespace(serving=led_epoch, led=led_epoch), leadership=SimpleNamespace(sync_set=None),
        followership=SimpleNamespace(follower=SimpleNamespace(committed=lambda t, p, log_end: log_end)),
        cache=lambda t, p: epochs, master_url=None,
    )
    node.coordinator = coordinator
    return node, coordinator


def test_a_deposed_master_serves_none_of_its_terms_writes_that_no_slave_fetched() -> None:
    epochs = EpochCache(Path("/nonexistent"), [(1, 0), (3, 100)])  # we led epoch 3 from offset 100
    node, coordinator = deposable_node(epochs, led_epoch=3)
    node.replica_fetched(1, 3, "t", 0, 150, object())  # slave 1 fetched to 150 (inside a batch)
    node.replica_fetched(2, 3, "t", 0, 120, object())
    node.replica_fetched(2, 2, "t", 0, 290, object())  # a stale term's report: not ours to count
    assert node.committed("t", 0, Log()) == 300, "leading (async): the flushed end"
    coordinator.state = Role.ORPHANED  # deposed; 200..300 were ours alone
    assert node.committed("t", 0, Log()) == 100, "the highest slave position, cut to a whole batch"
    node.replica_fetched(1, 3, "t", 0, 250, object())  # a late report while deposed: ignored
    coordinator.state = Role.FOLLOWING  # the next master chosen, our log not yet truncated
    assert node.committed("t", 0, Log()) == 100
    # Truncated against the new master: its epoch history replaces ours, so the bound goes.
    epochs.entries = [(1, 0), (3, 100), (4, 150)]
    assert node.committed("t", 0, Log()) == 300


def test_a_deposed_master_no_slave_reported_to_serves_only_what_it_held_when_its_term_began() -> None:
    epochs = EpochCache(Path("/nonexistent"), [(2, 0), (5, 180)])
    node, coordinator = deposable_node(epochs, led_epoch=5)  # e.g. restarted since: no reports
    coordinator.state = Role.ORPHANED
    assert node.committed("t", 0, Log()) == 180


def test_a_slave_that_never_led_the_partitions_newest_epoch_serves_its_whole_log() -> None:
    epochs = EpochCache(Path("/nonexistent"), [(1, 0), (3, 100)])
    node, coordinator = deposable_node(epochs, led_epoch=2)  # led an older epoch only
    coordinator.state = Role.ORPHANED
    assert node.committed("t", 0, Log()) == 300, "a plain orphaned slave keeps today's reads"
    node, coordinator = deposable_node(EpochCache(Path("/nonexistent")), led_epoch=0)
    coordinator.state = Role.FOLLOWING
    assert node.committed("t", 0, Log()) == 300
