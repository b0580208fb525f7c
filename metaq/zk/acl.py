"""ZooKeeper digest authentication and the ACL of every node the project creates.

Who may do what, by kind of path (``{root}`` is ``zk.zkRoot``):

    kind          paths                                            world            the group's brokers
    shared        {root}, /brokers, /brokers/ids,                   read, create,    (as world)
                  /brokers/topics-pub|sub and their {topic} nodes   delete
    group         /brokers/ids/{id} and everything below it,        read             all
                  /brokers/topic-config/{id}
                  (master, slave{k}, epoch, sync_set, checksum,
                  the group's topic configuration)
    per-group     /brokers/topic-config                             read, create     (as world)
    directory
    registration  /brokers/topics-pub|sub/{topic}/{id}-m|-s{k}      read             all
    consumers     /consumers and everything below it                all              all

A broker of group ``{id}`` authenticates with the digest user ``metaq-group-{id}`` (its
password derives from the group secret), so only that group's brokers can create, change
or delete its master lock, epoch and sync set. Anyone can read, so clients and tools need
no credentials. Shared directories must let every group add and withdraw its own entries;
ZooKeeper's DELETE permission is per parent, not per child, so a client without credentials
can withdraw a registration (an availability problem the owning broker repairs by
re-registering, never a way to change who is master or what is committed). A group's
topic configuration is never withdrawn, so its directory grants no DELETE at all: nobody
but the group can remove the topics its members serve.

Turning ACLs on for a running cluster: ``ensure_tree`` tightens every node of the group
that is still open (world holds ADMIN) and refuses to start on a group node that someone
else has locked (squatting), with the path and its ACL in the message.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Id, Permissions, make_acl, make_digest_acl, make_digest_acl_credential

from ..errors import MetaqError
from .paths import ZkPaths, parse_broker_node_name

log = logging.getLogger(__name__)

WORLD = Id("world", "anyone")
DIGEST_USER_PREFIX = "metaq-group-"


class ZkAclError(MetaqError):
    """A node's ACL is not what the group needs and cannot be fixed with our credentials."""


class PathKind(enum.Enum):
    SHARED = "shared"
    GROUP = "group"
    PER_GROUP_DIRECTORY = "per-group directory"
    REGISTRATION = "registration"
    CONSUMERS = "consumers"
    OUTSIDE = "outside"  # above or beside the root (the ancestors of a root like /a/b)


def digest_user(broker_id: int) -> str:
    return f"{DIGEST_USER_PREFIX}{broker_id}"


def classify(paths: ZkPaths, path: str) -> tuple[PathKind, int | None]:
    """The kind of ``path`` and, for group and registration nodes, the group it belongs to."""
    root = paths.root
    if path != (root or "/") and not path.startswith(root + "/"):
        return PathKind.OUTSIDE, None
    parts = [part for part in path[len(root):].split("/") if part]
    if parts[:1] == ["consumers"]:
        return PathKind.CONSUMERS, None
    if parts[:2] == ["brokers", "ids"] and len(parts) >= 3 and parts[2].isdigit():
        return PathKind.GROUP, int(parts[2])
    if parts[:2] == ["brokers", "topic-config"]:
        if len(parts) == 2:
            return PathKind.PER_GROUP_DIRECTORY, None
        if parts[2].isdigit():
            return PathKind.GROUP, int(parts[2])
    if parts[:1] == ["brokers"] and len(parts) >= 4 and parts[1] in ("topics-pub", "topics-sub"):
        try:
            group, _slave = parse_broker_node_name(parts[3])
        except ValueError:
            raise ZkAclError(f"{path}: not a registration node name (expected ID-m or ID-sK)") from None
        return PathKind.REGISTRATION, group
    return PathKind.SHARED, None


_SHARED_ACL = [make_acl("world", "anyone", read=True, create=True, delete=True)]
#: Every group adds its own node; none is ever withdrawn, so nobody may delete one.
_PER_GROUP_DIRECTORY_ACL = [make_acl("world", "anyone", read=True, create=True)]


@dataclass(frozen=True)
class ZkSecurity:
    """The ZooKeeper side of a broker of group ``broker_id`` with security on."""

    root: str
    broker_id: int
    password: str = field(repr=False)
    #: Where the password comes from (the group secret file), named when it does not match the group's.
    password_source: str = field(default="the group secret", compare=False)

    @property
    def paths(self) -> ZkPaths:
        return ZkPaths(self.root)

    def group_acl(self) -> list[ACL]:
        """Anyone reads; only this group's digest id changes, adds below or deletes."""
        return [make_acl("world", "anyone", read=True), make_digest_acl(digest_user(self.broker_id), self.password, all=True)]

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for KazooClient: the digest credentials, and the group ACL as default."""
        return {
            "auth_data": [("digest", f"{digest_user(self.broker_id)}:{self.password}")],
            "default_acl": self.group_acl(),
        }

    def acl_for(self, path: str) -> list[ACL]:
        kind, group = classify(self.paths, path)
        if kind in (PathKind.GROUP, PathKind.REGISTRATION):
            if group != self.broker_id:
                # Its ACL would need the other group's password: never ours to create.
                raise ZkAclError(f"{path} belongs to group {group}; a broker of group {self.broker_id} never creates it")
            return self.group_acl()
        if kind is PathKind.CONSUMERS:
            return list(OPEN_ACL_UNSAFE)
        if kind is PathKind.PER_GROUP_DIRECTORY:
            return list(_PER_GROUP_DIRECTORY_ACL)
        # Shared directories, and the ancestors of a root like /a/b: nobody may lock them.
        return list(_SHARED_ACL)

    # --- creating nodes ----------------------------------------------------------------------

    def ensure_parents(self, client: KazooClient, path: str) -> None:
        """Create the missing ancestors of ``path``, each with the ACL of its kind.

        kazoo's ``makepath`` would give every ancestor the new node's ACL, locking the
        shared directories to one group; this is the call to make instead.
        """
        parts = [part for part in path.split("/") if part]
        current = ""
        for part in parts[:-1]:
            current += "/" + part
            if client.exists(current) is None:
                self._create_directory(client, current)

    def _create_directory(self, client: KazooClient, path: str) -> None:
        try:
            client.create(path, b"", acl=self.acl_for(path))
        except NodeExistsError:
            pass  # another broker made it first: fine, its ACL is the same
        except NoAuthError:
            parent = path.rsplit("/", 1)[0] or "/"
            raise ZkAclError(
                f"cannot create ZooKeeper node {path}: its parent {parent} does not let this group "
                f"create nodes (ACL {_describe(client, parent)}); the ZooKeeper admin must fix or delete it"
            ) from None

    def create(self, client: KazooClient, path: str, value: bytes = b"", *, ephemeral: bool = False) -> str:
        """Create ``path`` (and its missing parents) with the right ACLs."""
        self.ensure_parents(client, path)
        return client.create(path, value, acl=self.acl_for(path), ephemeral=ephemeral)

    def ensure_tree(self, client: KazooClient) -> None:
        """Make the group's part of the tree exist with the right ACLs; call once per session."""
        paths = self.paths
        for directory in (paths.broker_ids(), paths.topics_pub(), paths.topics_sub(), paths.consumers()):
            self.ensure_parents(client, directory + "/x")
        group_node = paths.broker(self.broker_id)
        if client.exists(group_node) is None:
            self._create_directory(client, group_node)
        self._tighten(client, group_node)
        for child in client.get_children(group_node):
            self._tighten(client, f"{group_node}/{child}")
        topic_config = paths.topic_config(self.broker_id)
        self.ensure_parents(client, topic_config)
        self._correct_directory(client, topic_config.rsplit("/", 1)[0])
        self._tighten(client, topic_config)

    def _correct_directory(self, client: KazooClient, path: str) -> None:
        """Give a directory made by an older version (world DELETE, or one group's ACL) its ACL,
        when our credentials may; otherwise say what is wrong and go on (it still works)."""
        try:
            acl, stat = client.get_acls(path)
            if sorted(acl, key=repr) != sorted(self.acl_for(path), key=repr):
                client.set_acls(path, self.acl_for(path), version=stat.aversion)
        except NoAuthError:
            log.warning("ZooKeeper node %s has ACL %s, not %s; the ZooKeeper admin should set it",
                        path, _describe(client, path), _describe_acl(self.acl_for(path)))

    def _tighten(self, client: KazooClient, path: str) -> None:
        try:
            acl, stat = client.get_acls(path)
        except NoNodeError:
            return  # an ephemeral that just went
        except NoAuthError:
            acl, stat = [], None  # not even readable: someone else's
        wanted = self.acl_for(path)
        if sorted(acl, key=repr) == sorted(wanted, key=repr):
            return
        world_admin = any(entry.id == WORLD and entry.perms & Permissions.ADMIN for entry in acl)
        me = make_digest_acl_credential(digest_user(self.broker_id), self.password)
        ours = any(entry.id.id == me and entry.perms & Permissions.ADMIN for entry in acl)
        if not (world_admin or ours) and any(entry.id.id.startswith(digest_user(self.broker_id) + ":") for entry in acl):
            # The group's digest user with another password: the node is our group's, made by
            # members holding another group secret. Ours is the wrong one (or theirs is), and no
            # ZooKeeper call of ours will be allowed: say which file, once, instead of failing later.
            raise ZkAclError(
                f"ZooKeeper node {path} belongs to broker group {self.broker_id}, whose other members use another"
                f" group secret than {self.password_source}: copy the group's secret file to this broker"
                " (every member of a group needs the same one; docs/security.md)"
            )
        if stat is None or not (world_admin or ours):
            raise ZkAclError(
                f"ZooKeeper node {path} is locked by someone else (ACL {_describe(client, path)}); "
                "the ZooKeeper admin must delete it before this group can use it"
            )
        client.set_acls(path, wanted, version=stat.aversion)


def _describe(client: KazooClient, path: str) -> str:
    """A node's ACL for an error message (digest hashes left out), or why it cannot be shown."""
    try:
        acl, _stat = client.get_acls(path)
    except NoAuthError:
        return "not readable without its owner's credentials"
    except NoNodeError:
        return "node gone"
    return _describe_acl(acl)


def _describe_acl(acl: list[ACL]) -> str:
    return ", ".join(f"{entry.id.scheme}:{entry.id.id.split(':')[0]}={entry.perms}" for entry in acl)


SUPER_USER = "super"


def super_digest(password: str) -> str:
    """The ``superDigest`` value for a ZooKeeper server whose admin logs in as ``super:{password}``."""
    if not password:
        raise ZkAclError("the ZooKeeper admin password must not be empty")
    return make_digest_acl_credential(SUPER_USER, password)


def client_kwargs(security: ZkSecurity | None) -> dict[str, Any]:
    """KazooClient keyword arguments: none without security, credentials and default ACL with it."""
    return security.client_kwargs() if security is not None else {}
