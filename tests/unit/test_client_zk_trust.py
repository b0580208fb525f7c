"""Which ZooKeeper group nodes a client with a login trusts (metaq/client/cluster.py : group_node_locked)."""

from __future__ import annotations

from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl

from metaq.client.cluster import group_node_locked
from metaq.zk.acl import ZkSecurity


def test_the_acl_a_secured_broker_sets_is_trusted_for_its_group_only() -> None:
    acl = ZkSecurity("/meta", 7, "secret").group_acl()
    assert group_node_locked(acl, 7)
    assert not group_node_locked(acl, 8)


def test_a_node_others_may_change_is_not_trusted() -> None:
    owner = make_digest_acl("metaq-group-7", "secret", all=True)
    assert not group_node_locked(list(OPEN_ACL_UNSAFE), 7)
    assert not group_node_locked([owner, make_acl("world", "anyone", read=True, create=True)], 7)
    assert not group_node_locked([make_digest_acl("metaq-group-7", "secret", read=True, write=True)], 7)
    assert not group_node_locked([owner, make_digest_acl("someone", "x", all=True)], 7)
