"""Transactional ids: a stable name for a producer, so a restarted instance fences its zombie.

``init_producer`` with a ``transactional_id`` answers the id's producer id with its
epoch raised by one (the first init of a name takes a fresh producer id, epoch 0).
The broker then treats every lower epoch of that producer id as a zombie
(metaq/server/transactions.py ``fence``).

``TransactionalIds`` is the one owner of a producer id's newest epoch (its ``Fence``;
Kafka's coordinator-side ``TransactionMetadata``): the group's mapping, and this broker's
view of it (``fence_of``), written only here: by ``init`` once its compare-and-set
succeeded, and by ``load`` (the mapping read when this broker takes up mastership: another
master's inits). A partition's producer table (metaq/txn/producer_state.py) records only
what was appended to that partition; the put path asks both (``plan_put``'s one verdict).

Rules kept here:

* **one owner per name, epochs only rise**: the mapping name -> (producer id, epoch)
  is changed only by a compare-and-set, so two concurrent inits of one name get
  distinct epochs and the later one wins;
* **the epoch fits the BATCH record's int16**: an epoch past ``MAX_EPOCH`` is never
  handed out; the name takes a new producer id at epoch 0 instead (as Kafka does),
  and the old producer id is fenced as a whole;
* **a name belongs to the user who first inited it** (with security on): another
  user's init of it is refused (``NotOwner``, naming no user), or anyone could fence
  another application's producer; ``admin`` may init any name (the owner stays);
* **the mapping names no user**: the owner is recorded as the user's keyed tag
  (metaq/security/principal_tags.py), since anyone may read the group's ZooKeeper nodes
  and a user name there would undo the SCRAM decoys (which hide whether a user exists).
  A node written before tags holds ``"principal"`` (the plain name): it is read as that
  user's tag, and the next init of the name rewrites it with the tag;
* **names are bounded**: a new name is refused (``TooManyNames``) once its user owns
  ``maxTransactionalIdsPerUser`` names in the group, or the group holds ``MAX_NAMES``;
  every name is a znode the next master reads before it serves transactions. Names are
  counted from the mapping, read once per broker (at its first new name) and kept up to
  date by its own inits: only the group's master inits names. A name is never removed by
  the broker; an operator removes an unused one by deleting its node (below) with the
  group's ZooKeeper credentials, and a new master then counts without it;
* **a name is checked like a topic name** (letters, digits, ``.``, ``_``, ``-``,
  1..200 characters): it becomes a ZooKeeper node name.

Where the mapping lives:

* with ZooKeeper: ``{root}/brokers/ids/{id}/transactional_ids/{name}`` (persistent, JSON
  ``{"producer_id": P, "epoch": E}``, plus ``"user_tag"`` with security on), under the group's node with the group's ACL,
  so a new master (or a restarted one) continues from the epoch the old one handed out;
* without ZooKeeper: ``{dataPath}/transactional-ids`` (CRC-guarded JSON map, replaced
  atomically, fsynced before the answer).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from ..txn.crcfile import read_crc_file, write_crc_file
from ..zk.paths import ZkPaths
from .producer_ids import CAS_ATTEMPTS, ProducerIdAllocator

if TYPE_CHECKING:
    from ..security.principal_tags import PrincipalTags

#: Names a broker group holds at most, over all users (each is a znode read at take-over).
MAX_NAMES = 100_000
#: The BATCH record stores the epoch as a signed int16.
MAX_EPOCH = (1 << 15) - 1
LOCAL_FILE = "transactional-ids"
ZK_DIRECTORY = "transactional_ids"
_NAME = re.compile(r"[A-Za-z0-9._\-]{1,200}")


def check_transactional_id(name: object) -> str:
    """The name, or ValueError saying the rule it breaks (it comes from the network)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"transactional id {name!r} must be 1..200 letters, digits, '.', '_' or '-'")
    return name


class NotOwner(PermissionError):
    """The name belongs to another user."""


class TooManyNames(PermissionError):
    """A new name past its user's or the group's cap."""


class Fence(NamedTuple):
    """A producer id's lowest epoch still allowed, and its transactional id when known."""

    epoch: int
    name: str | None = None


class Owner(NamedTuple):
    producer_id: int
    epoch: int
    #: The tag of the user the name belongs to (None: security off, anyone's).
    user_tag: str | None = None
    #: A record written before tags: the owner's plain user name (``TransactionalIds`` tags it).
    legacy_user: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"producer_id": self.producer_id, "epoch": self.epoch, "user_tag": self.user_tag,
                "principal": self.legacy_user}
        return {key: value for key, value in data.items() if value is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Owner:
        return cls(int(data["producer_id"]), int(data["epoch"]), data.get("user_tag"), data.get("principal"))


class MappingStore(Protocol):
    """Blocking I/O; ``version`` is the compare-and-set token (None: the name is new)."""

    def read(self, name: str) -> tuple[Owner | None, Any]: ...

    def write(self, name: str, owner: Owner, version: Any) -> bool: ...

    def read_all(self) -> dict[str, Owner]: ...


def next_owner(current: Owner | None, fresh_id: int | None, user_tag: str | None = None) -> Owner | None:
    """The owner after one more init: the epoch + 1, or ``fresh_id`` at epoch 0 (None: a fresh id is needed).

    The name keeps the user it belongs to; a new name belongs to ``user_tag``.
    """
    if current is not None:
        user_tag = current.user_tag or user_tag
        if current.epoch < MAX_EPOCH:
            return Owner(current.producer_id, current.epoch + 1, user_tag)
    return None if fresh_id is None else Owner(fresh_id, 0, user_tag)


class TransactionalIds:
    """``init(name)``: the new owner and the one it replaces (None for a new name)."""

    def __init__(self, allocator: ProducerIdAllocator, store: MappingStore, max_per_user: int = 1000,
                 tags: "PrincipalTags | None" = None) -> None:
        self.allocator = allocator
        self.store = store
        self.max_per_user = max_per_user
        #: How owners are recorded (None: as the plain name; only unit tests, security on has tags).
        self.tags = tags
        #: user tag (None: security off) -> names owned; None until the first new name needs it.
        self._counts: dict[str | None, int] | None = None
        # Inits served by this broker go one at a time (the local file has no other guard);
        # the compare-and-set below keeps inits on different brokers apart.
        self._lock = asyncio.Lock()
        #: Producer id -> its fence, this broker's view of the mapping. Written only by ``_note``
        #: (from ``_init`` after its write, and ``load``); epochs in it only rise, like the mapping's.
        self._fences: dict[int, Fence] = {}

    def fence_of(self, producer_id: int) -> Fence | None:
        """The newest epoch of the transactional id holding ``producer_id`` (None: no name known)."""
        return self._fences.get(producer_id)

    async def load(self) -> None:
        """Read the group's mapping into ``fence_of`` (at a take-over: inits another master served)."""
        for name, owner in (await self.all()).items():
            self._note(name, owner, None)

    def _note(self, name: str, owner: Owner, previous: Owner | None) -> None:
        self._raise(owner.producer_id, owner.epoch, name)
        if previous is not None and previous.producer_id != owner.producer_id:
            # The epoch overflowed and the name moved to a new id: every epoch of the old one is a zombie.
            self._raise(previous.producer_id, MAX_EPOCH + 1, name)

    def _raise(self, producer_id: int, epoch: int, name: str) -> None:
        old = self._fences.get(producer_id)
        if old is None or epoch >= old.epoch:  # never lowered: a read older than an init changes nothing
            self._fences[producer_id] = Fence(epoch, name)

    async def init(self, name: str, principal: str | None = None, *, admin: bool = False) -> tuple[Owner, Owner | None]:
        """``principal``: the requesting user (None: security off); ``admin`` may init any name."""
        check_transactional_id(name)
        async with self._lock:
            return await self._init(name, principal, admin)

    def _tag(self, user: str) -> str:
        return user if self.tags is None else self.tags.tag(user)

    def _tagged(self, owner: Owner | None) -> Owner | None:
        """``owner`` with its user as a tag (a record older than tags names the user)."""
        if owner is None or owner.legacy_user is None:
            return owner
        return Owner(owner.producer_id, owner.epoch, owner.user_tag or self._tag(owner.legacy_user))

    async def _init(self, name: str, principal: str | None, admin: bool) -> tuple[Owner, Owner | None]:
        user_tag = None if principal is None else self._tag(principal)
        for _ in range(CAS_ATTEMPTS):
            current, version = await asyncio.to_thread(self.store.read, name)
            current = self._tagged(current)  # so the write below replaces a legacy user name by its tag
            if current is not None and current.user_tag not in (None, user_tag) and not admin:
                raise NotOwner(f"transactional id {name} belongs to another user; only that user (or admin) may init it")
            if current is None:
                await self._check_room(name, principal, user_tag)
            owner = next_owner(current, None, user_tag)
            if owner is None:  # new name or epoch overflow; an id taken and then lost to a race is skipped
                owner = next_owner(current, await self.allocator.allocate(), user_tag)
            assert owner is not None
            if await asyncio.to_thread(self.store.write, name, owner, version):
                if current is None and self._counts is not None:
                    self._counts[user_tag] = self._counts.get(user_tag, 0) + 1
                self._note(name, owner, current)  # the fence moves with the mapping, nowhere else
                return owner, current
        raise RuntimeError(f"transactional id {name}: too many concurrent inits")

    async def _check_room(self, name: str, principal: str | None, user_tag: str | None) -> None:
        """TooManyNames if a new name of ``principal`` (tagged ``user_tag``) would pass a cap."""
        if self._counts is None:
            counts: dict[str | None, int] = {}
            for owner in (await self.all()).values():
                counts[owner.user_tag] = counts.get(owner.user_tag, 0) + 1
            self._counts = counts
        if principal is not None and self._counts.get(user_tag, 0) >= self.max_per_user:
            raise TooManyNames(f"transactional id {name}: user {principal!r} already owns {self.max_per_user} "
                               "transactional ids (maxTransactionalIdsPerUser); reuse one or have an unused one removed")
        if sum(self._counts.values()) >= MAX_NAMES:
            raise TooManyNames(f"transactional id {name}: the broker group already holds {MAX_NAMES} transactional ids; "
                               "reuse one or have an unused one removed")

    async def all(self) -> dict[str, Owner]:
        """Every name's owner, users as tags."""
        owners = await asyncio.to_thread(self.store.read_all)
        return {name: self._tagged(owner) for name, owner in owners.items()}  # type: ignore[misc]


class ZooKeeperMapping:
    def __init__(self, client: Any, paths: ZkPaths, group: int, create: Callable[[str, bytes], Any]) -> None:
        self.client = client
        self.directory = f"{paths.broker(group)}/{ZK_DIRECTORY}"
        self.create = create  # makes a node (and its parents) with the group's ACL

    def read(self, name: str) -> tuple[Owner | None, Any]:
        try:
            value, stat = self.client.get(f"{self.directory}/{name}")
        except NoNodeError:
            return None, None
        return Owner.from_json(json.loads(value.decode())), stat.version

    def write(self, name: str, owner: Owner, version: Any) -> bool:
        path, value = f"{self.directory}/{name}", json.dumps(owner.to_json()).encode()
        try:
            if version is None:
                self.create(path, value)
            else:
                self.client.set(path, value, version=version)
        except (NodeExistsError, BadVersionError):
            return False  # another init of the same name came first: read again
        return True

    def read_all(self) -> dict[str, Owner]:
        try:
            names = self.client.get_children(self.directory)
        except NoNodeError:
            return {}
        owners = {}
        for name in names:
            owner, _version = self.read(name)
            if owner is not None:
                owners[name] = owner
        return owners


class LocalMapping:
    """A broker without ZooKeeper: one process serves every init, so the file needs no version."""

    def __init__(self, data_path: str | Path) -> None:
        self.path = Path(data_path) / LOCAL_FILE

    def read(self, name: str) -> tuple[Owner | None, Any]:
        return self.read_all().get(name), None

    def write(self, name: str, owner: Owner, version: Any) -> bool:
        owners = self.read_all()
        owners[name] = owner
        body = json.dumps({n: o.to_json() for n, o in sorted(owners.items())}).encode()
        write_crc_file(self.path, body)  # fsynced before the producer learns its epoch
        return True

    def read_all(self) -> dict[str, Owner]:
        raw = read_crc_file(self.path)
        return {} if not raw else {name: Owner.from_json(data) for name, data in json.loads(raw.decode()).items()}
