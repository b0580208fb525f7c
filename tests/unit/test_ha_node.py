"""The HA facade (metaq/ha/node.py): the one role answer, and a slave's position kept once."""

from __future__ import annotations

from types import SimpleNamespace

from metaq.config import SlaveConfig
from metaq.ha.node import HaNode
from metaq.ha.role import Role
from metaq.protocol import commands as c


class Log:
    log_end = flushed_end = 300


HOST = SimpleNamespace(config=SimpleNamespace(broker_id=2), registry=SimpleNamespace(slave_id=1))


def node_in(state: Role, slave: SlaveConfig | None = None) -> HaNode:
    node = HaNode(HOST, slave, in_zookeeper=True)
    node.coordinator = SimpleNamespace(
        state=state, serving_epoch=4, sync_set=None, follower=None, master_url="m:1", may_ack=lambda: state is Role.LEADING,
        handover_target=1,
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
    node = HaNode(HOST, None, in_zookeeper=False)
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
