"""Which ACL each kind of ZooKeeper path gets (the server-side behaviour is in tests/integration/test_zk_acl.py)."""

from __future__ import annotations

import pytest
from kazoo.security import Permissions

from metaq.zk.acl import PathKind, ZkAclError, ZkSecurity, classify, digest_user, super_digest
from metaq.zk.paths import ZkPaths


def test_paths_are_classified() -> None:
    paths = ZkPaths("/meta")
    assert classify(paths, "/meta") == (PathKind.SHARED, None)
    assert classify(paths, "/meta/brokers/ids") == (PathKind.SHARED, None)
    assert classify(paths, "/meta/brokers/ids/3") == (PathKind.GROUP, 3)
    assert classify(paths, "/meta/brokers/ids/3/sync_set") == (PathKind.GROUP, 3)
    assert classify(paths, "/meta/brokers/topics-sub/t") == (PathKind.SHARED, None)
    assert classify(paths, "/meta/brokers/topics-sub/t/3-s1") == (PathKind.REGISTRATION, 3)
    assert classify(paths, "/meta/consumers/g/offsets/t/0-0") == (PathKind.CONSUMERS, None)
    assert classify(paths, "/meta/brokers/topic-config") == (PathKind.PER_GROUP_DIRECTORY, None)
    assert classify(paths, "/meta/brokers/topic-config/3") == (PathKind.GROUP, 3)
    assert classify(paths, "/other/x") == (PathKind.OUTSIDE, None)
    assert classify(paths, "/metax") == (PathKind.OUTSIDE, None)
    security = ZkSecurity("/meta", 0, "pw")
    with pytest.raises(ZkAclError, match="belongs to group 1"):
        security.acl_for("/meta/brokers/ids/1/master")
    with pytest.raises(ZkAclError, match="not a registration node name"):
        classify(paths, "/meta/brokers/topics-pub/t/garbage")
    assert security.acl_for("/other") == security.acl_for("/meta/brokers")  # ancestors of a deep root
    assert security.acl_for("/meta/consumers/g") != security.acl_for("/meta/brokers")
    assert security.acl_for(paths.topic_config(0)) == security.group_acl()
    # Nobody may delete a group's topic configuration: its directory grants no DELETE.
    assert [entry.perms for entry in security.acl_for("/meta/brokers/topic-config")] == [Permissions.READ | Permissions.CREATE]


def test_client_kwargs_log_in_as_the_group_and_default_to_its_acl() -> None:
    security = ZkSecurity("/meta", 3, "pw")
    kwargs = security.client_kwargs()
    assert kwargs["auth_data"] == [("digest", f"{digest_user(3)}:pw")]
    (world, group) = kwargs["default_acl"]
    assert world.perms == Permissions.READ and group.perms == Permissions.ALL
    assert group.id.id.startswith("metaq-group-3:") and "pw" not in group.id.id
    assert "pw" not in repr(security)


def test_super_digest_refuses_an_empty_password() -> None:
    with pytest.raises(ZkAclError):
        super_digest("")
