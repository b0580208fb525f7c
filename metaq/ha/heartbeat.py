"""UDP heartbeats between a master and its slaves (asyncio-dgram).

Every broker binds UDP on its ``hostName:serverPort`` (the same number as its TCP
port) and answers heartbeats; a slave that follows a master sends one every
``interval`` (500 ms) to the master's address::

    slave  -> master  {kind:"hb", role:"slave", broker_id, slave_id, epoch,
                       log_ends: {"topic/partition": end}, incarnations: {topic: id}, sent_at}
    master -> slave   {kind:"hb", role:"master", broker_id, epoch, log_ends,
                       committed: {"topic/partition": offset}, sent_at, echo}

``echo`` is the slave's ``sent_at``, so the slave measures the round trip.

What they are for: lag figures only. The master records each slave's log ends
(``ReplicationProgress.heartbeat``) and keeps a quiet sync-set member counted;
a log end counts only for the life of its topic the master serves: each comes with
the slave's incarnation of its topic, and one of another life (a heartbeat sent
before the slave applied a delete and re-create, or by a slave that has not yet) is
dropped. Otherwise the old log's end, once the new log grows past it, would count
as copies the slave does not have and release sync acks it lacks (a path found in
review; no run has shown it).
the slave learns the master's log ends even while its fetches are blocked, and
shows how long the master has been silent (``master_silent_for_ms`` in stats).
Nothing acts on that silence: they never decide roles, **ZooKeeper alone
decides who is master** (through its session timeout).

The ``role`` a broker answers with is its HA role as the HA layer holds it
(``HaView.acting_master``), not how it was started: a broker started with
``--slave`` and since promoted answers as the master.

Robustness: a datagram that is not msgpack, not a map, not a heartbeat, of the
wrong broker group, or with badly typed fields is counted in ``bad`` and
ignored; nothing here can take the broker down. A failed UDP bind is logged and
leaves the broker running without heartbeats.

Trust: with security on every heartbeat carries ``mac``, an HMAC-SHA256 of the rest
keyed by a key derived from the group secret, and one without a valid ``mac`` is
ignored (a forged heartbeat could otherwise keep a dead slave counted or move its
position). In any mode the master records heartbeats only from slave ids ZooKeeper
names (``known_slave``) and only for partitions it has, so the state a stream of
datagrams can create is bounded by the group's real slaves and partitions.

Replay (signed heartbeats): a recorded heartbeat keeps a valid ``mac`` forever, so the
master also requires its ``sent_at`` (the slave's wall clock) to be within
``SENT_AT_WINDOW_S`` of its own and above the last one it accepted from that slave;
a replayed one is counted in ``bad`` and neither recorded nor answered.

Many partitions: one datagram holds at most ``MAX_DATAGRAM`` bytes, about 1,500 log ends
with their room for the answer. A slave's beat (``SlaveHeartbeat.messages``) therefore names
the log ends that moved since it last sent them, plus the next slice of a rotation over all
of them (every log end is sent again at least every ``FULL_REPORT_EVERY_S``), split over as
many datagrams as it takes, each a complete signed heartbeat of its own. The master records
each as it comes (positions only move forward there), so nothing is cut off whatever the
partition count, and an idle slave of 10,000 partitions sends ~170 log ends a beat, not
10,000. A lost datagram's log ends come again with the rotation. Nor does a beat walk every
partition: the follower tells it which replicas appended since the last beat
(``ReplicaPositions.moved``) and keeps the rotation's list of partitions until its replicas
change, so a beat looks at the moved partitions and its slice only (a beat to a new master
names them all once).

Reflection: the master answers only to the host the slave registered in ZooKeeper
(``slave_hosts``), and never with more bytes than the heartbeat it answers
(``_fit_reply``): a slave pads its heartbeat (``pad``) with room for the answer about
its partitions, and an answer that would still be bigger loses fields until it fits.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Protocol, Sequence

import asyncio_dgram
import msgpack

from metaq.store.incarnation import same_life

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 0.5
#: Datagrams larger than this are ignored (and we never send one bigger).
MAX_DATAGRAM = 60 * 1024
#: A signed heartbeat's ``sent_at`` must be within this many seconds of the master's clock
#: (replays of old heartbeats; also the clock skew the group's hosts may have).
SENT_AT_WINDOW_S = 10.0
#: What a slave pads its heartbeat with so that the answer (its partitions' log ends and
#: committed offsets, ``echo``) fits in as many bytes: per partition and in all.
REPLY_ROOM_PER_PARTITION = 10
REPLY_ROOM_FIXED = 32
#: The answer's fields dropped, in this order, until it is no bigger than the heartbeat.
REPLY_FIELDS_TO_DROP = ("committed", "log_ends", "echo")
#: Every log end a slave has is sent again at least this often, moved or not (a datagram may
#: be lost; a new master learns them all with the first beat); log ends that moved go with
#: the next beat. The master reads each log end it is sent (and answers its own figures for
#: it): a rotation of 1,000 a beat cost an idle master of 2,000 partitions ~2% of a core.
FULL_REPORT_EVERY_S = 30.0
#: A beat sends at least this many log ends of the rotation: a slave of up to this many
#: partitions sends all of them every beat.
ROTATION_MIN = 100
#: Bytes kept free in each datagram for what the size estimate does not count (map headers,
#: ``mac``, the fixed fields).
DATAGRAM_MARGIN = 2048


class BadHeartbeat(ValueError):
    """A datagram that is not a well-formed heartbeat."""


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def parse_partition_key(key: Any) -> tuple[str, int]:
    if not isinstance(key, str):
        raise BadHeartbeat("partition key is not a string")
    topic, sep, number = key.rpartition("/")
    if not sep or not topic or not number.isdigit():
        raise BadHeartbeat(f"bad partition key {key!r}")
    return topic, int(number)


def _int(message: dict[str, Any], name: str) -> int:
    value = message.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadHeartbeat(f"field {name!r} must be an integer")
    return value


def _ends(message: dict[str, Any], name: str) -> dict[tuple[str, int], int]:
    raw = message.get(name, {})
    if not isinstance(raw, dict):
        raise BadHeartbeat(f"field {name!r} must be a map")
    ends: dict[tuple[str, int], int] = {}
    for key, value in raw.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadHeartbeat(f"{name}[{key!r}] must be a non-negative integer")
        ends[parse_partition_key(key)] = value
    return ends


def _incarnations(message: dict[str, Any]) -> dict[str, str]:
    raw = message.get("incarnations", {})
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise BadHeartbeat("field 'incarnations' must map topic names to strings")
    return raw


def _mac(key: bytes, message: dict[str, Any]) -> bytes:
    return hmac.new(key, encode(message), hashlib.sha256).digest()


def decode(data: bytes, expect_role: str, key: bytes | None = None) -> dict[str, Any]:
    """Decode and check one heartbeat datagram (raises BadHeartbeat); with ``key``, its MAC too."""
    if len(data) > MAX_DATAGRAM:
        raise BadHeartbeat(f"datagram of {len(data)} bytes is too big")
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises many kinds of errors on garbage
        raise BadHeartbeat(f"not msgpack: {exc}") from None
    if not isinstance(message, dict) or message.get("kind") != "hb":
        raise BadHeartbeat("not a heartbeat")
    if key is not None:
        mac = message.pop("mac", None)
        if not isinstance(mac, bytes) or not hmac.compare_digest(mac, _mac(key, message)):
            raise BadHeartbeat("missing or wrong MAC (not a broker of this group)")
    if message.get("role") != expect_role:
        raise BadHeartbeat(f"expected role {expect_role!r}, got {message.get('role')!r}")
    _int(message, "broker_id")
    _int(message, "epoch")
    if expect_role == "slave":
        if _int(message, "slave_id") < 0:
            raise BadHeartbeat("slave_id must be >= 0")
    sent_at = message.get("sent_at")
    if not isinstance(sent_at, (int, float)) or isinstance(sent_at, bool):
        raise BadHeartbeat("field 'sent_at' must be a number")
    message["_log_ends"] = _ends(message, "log_ends")
    message["_incarnations"] = _incarnations(message) if expect_role == "slave" else {}
    message["_committed"] = _ends(message, "committed") if expect_role == "master" else {}
    return message


def encode(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def encode_signed(message: dict[str, Any], key: bytes | None) -> bytes:
    """The datagram of ``message``, with its ``mac`` when the group has a key."""
    if key is None:
        return encode(message)
    return encode({**message, "mac": _mac(key, message)})


# --- the answering side (every broker; records progress when it is the master) -------


class HaView(Protocol):
    """What the responder reads of the broker's HA state (metaq.ha.node.HaNode)."""

    @property
    def epoch(self) -> int: ...

    @property
    def acting_master(self) -> bool: ...

    def committed(self, topic: str, partition: int, log: Any) -> int: ...

    def slave_heartbeat(self, slave_id: int, address: str | None, log_ends: dict[tuple[str, int], int], epoch: int) -> None:
        """A slave's heartbeat reached this (acting) master."""


class HeartbeatResponder:
    """Binds UDP on the broker's address and answers heartbeats."""

    def __init__(
        self,
        broker_id: int,
        ha: HaView,
        logs: Callable[[], dict[tuple[str, int], Any]],
        host: str,
        port: int,
        *,
        key: bytes | None = None,
        known_slave: Callable[[int], bool] = lambda slave_id: True,
        slave_hosts: Callable[[int], Collection[str] | None] | None = None,
        clock: Callable[[], float] = time.time,
        incarnations: Callable[[], dict[str, str]] = dict,
    ) -> None:
        self.broker_id = broker_id
        self.key = key
        self.known_slave = known_slave
        #: The incarnation of each topic this broker serves (topic -> id; "" or absent: none).
        self.incarnations = incarnations
        #: The addresses (IPs) a slave registered from; None (or a None answer): any source, as it is not known.
        self.slave_hosts = slave_hosts
        self.clock = clock
        #: The ``sent_at`` of the last signed heartbeat accepted from each slave (replays are below it).
        self._last_sent_at: dict[int, float] = {}
        self.unanswered = 0
        self.ha = ha
        self.logs = logs
        self.host = host
        self.port = port
        self.received = 0
        self.answered = 0
        self.bad = 0
        self.last_bad: str | None = None
        self._stream: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> bool:
        try:
            self._stream = await asyncio_dgram.bind((self.host, self.port))
        except OSError as exc:
            log.warning("no UDP heartbeats: cannot bind %s:%d: %s", self.host, self.port, exc)
            return False
        self._task = asyncio.ensure_future(self._serve())
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    async def _serve(self) -> None:
        while True:
            try:
                data, addr = await self._stream.recv()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # ICMP errors surface here; keep serving
                log.debug("heartbeat recv: %s", exc)
                await asyncio.sleep(0.01)
                continue
            try:
                reply = self.handle(data, addr)
            except Exception as exc:  # never let a datagram kill the loop
                self.bad += 1
                self.last_bad = f"internal error: {exc}"
                log.exception("heartbeat handling failed")
                continue
            if reply is None:
                continue
            try:
                await self._stream.send(reply, addr)
                self.answered += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("heartbeat answer to %s failed: %s", addr, exc)

    def handle(self, data: bytes, addr: Any) -> bytes | None:
        """Record one slave heartbeat; the answer to send back, or None (ignored)."""
        ha = self.ha
        try:
            message = decode(data, "slave", self.key)
            if message["broker_id"] != self.broker_id:
                raise BadHeartbeat(f"heartbeat for broker {message['broker_id']}, this is broker {self.broker_id}")
            if not self.known_slave(message["slave_id"]):
                raise BadHeartbeat(f"slave{message['slave_id']} is not registered in ZooKeeper")
            if self.key is not None:
                self._check_fresh(message["slave_id"], message["sent_at"])
        except BadHeartbeat as exc:
            self.bad += 1
            self.last_bad = str(exc)
            log.debug("ignored a bad heartbeat from %s: %s", addr, exc)
            return None
        self.received += 1
        master = ha.acting_master
        logs = self.logs()
        if master:
            address = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else None
            # Only partitions we have (made-up keys must not grow the progress table), and
            # only in the life of their topic we serve (see the module docstring).
            ours, theirs = self.incarnations(), message["_incarnations"]
            # Never past our log end either (Handlers._replica_progress: a longer log is not ours).
            ends = {key: end for key, end in message["_log_ends"].items()
                    if key in logs and end <= logs[key].log_end and same_life(theirs.get(key[0], ""), ours.get(key[0], ""))}
            ha.slave_heartbeat(message["slave_id"], address, ends, message["epoch"])
        if not self._registered_source(message["slave_id"], addr):
            self.unanswered += 1
            return None
        # Only the partitions the slave asked about: the answer must not outgrow the question.
        log_ends, committed = {}, {}
        for topic, partition in message["_log_ends"]:
            log_ = logs.get((topic, partition))
            if log_ is None:
                continue  # not ours: a partition we do not have (a deleted topic's, say)
            try:
                offset = ha.committed(topic, partition, log_)
            except LookupError:  # UnknownTopic/UnknownPartition: dropped meanwhile, not ours either
                continue
            key = partition_key(topic, partition)
            log_ends[key] = log_.log_end
            committed[key] = offset
        reply = {
            "kind": "hb",
            "role": "master" if master else "slave",
            "broker_id": self.broker_id,
            "epoch": ha.epoch,
            "log_ends": log_ends,
            "committed": committed,
            "sent_at": time.time(),
            "echo": message["sent_at"],
        }
        encoded = _fit_reply(reply, self.key, len(data))
        if encoded is None:
            self.unanswered += 1
        return encoded

    def _check_fresh(self, slave_id: int, sent_at: float) -> None:
        """A signed heartbeat must be recent and newer than the last one accepted from its slave (no replay)."""
        skew = sent_at - self.clock()
        if abs(skew) > SENT_AT_WINDOW_S:
            raise BadHeartbeat(
                f"slave{slave_id}'s heartbeat sent_at is {skew:+.1f} s from this broker's clock "
                f"(outside +-{SENT_AT_WINDOW_S:.0f} s: replayed, or the clocks disagree)"
            )
        last = self._last_sent_at.get(slave_id)
        if last is not None and sent_at <= last:
            raise BadHeartbeat(f"slave{slave_id}'s heartbeat is not newer than the last one accepted (replayed)")
        self._last_sent_at[slave_id] = sent_at

    def _registered_source(self, slave_id: int, addr: Any) -> bool:
        """Did the heartbeat come from the host the slave registered (so an answer cannot be sent elsewhere)?"""
        hosts = self.slave_hosts(slave_id) if self.slave_hosts is not None else None
        if hosts is None:
            return True
        return isinstance(addr, tuple) and bool(addr) and addr[0] in hosts

    def status_pairs(self) -> list[tuple[str, object]]:
        return [
            ("heartbeat_udp", f"{self.host}:{self.port}" if self.running else "off"),
            ("heartbeats_received", self.received),
            ("heartbeats_bad", self.bad),
            ("heartbeats_unanswered", self.unanswered),
        ]


def _chunks(entries: list[tuple[tuple[str, int], int]]) -> list[list[tuple[tuple[str, int], int]]]:
    """``entries`` in runs whose heartbeat should fit in a datagram (an estimate: each
    key twice, once named and once as room for the answer, its number, and each topic's
    incarnation once; ``SlaveHeartbeat._encode_chunk`` splits a run that does not fit after all)."""
    budget = MAX_DATAGRAM - DATAGRAM_MARGIN
    chunks: list[list[tuple[tuple[str, int], int]]] = [[]]
    size = 0
    topics: set[str] = set()
    for entry in entries:
        topic = entry[0][0]
        cost = 2 * (len(topic) + 8) + REPLY_ROOM_PER_PARTITION + 12  # "topic/NNNNN", its end, its room
        if size + cost + len(topic) + 48 > budget and chunks[-1]:
            chunks.append([])
            size = 0
            topics = set()
        if topic not in topics:
            cost += len(topic) + 48  # the topic's incarnation, named once per datagram
            topics.add(topic)
        chunks[-1].append(entry)
        size += cost
    return chunks


def _fit_reply(reply: dict[str, Any], key: bytes | None, limit: int) -> bytes | None:
    """The signed answer in at most ``limit`` bytes (the heartbeat's size), dropping fields until it fits; None if it never does."""
    encoded = encode_signed(reply, key)
    for name in REPLY_FIELDS_TO_DROP:
        if len(encoded) <= limit:
            return encoded
        reply.pop(name, None)
        encoded = encode_signed(reply, key)
    return encoded if len(encoded) <= limit else None


# --- the slave side -------------------------------------------------------------------


@dataclass
class MasterHeartbeat:
    """The last heartbeat answer from the master, as the slave saw it."""

    received_at: float  # time.monotonic() on the slave
    broker_id: int
    epoch: int
    role: str
    log_ends: dict[tuple[str, int], int] = field(default_factory=dict)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    rtt_ms: float | None = None


Key = tuple[str, int]


class ReplicaPositions(Protocol):
    """What a slave's beat reports, without walking every partition each beat."""

    def keys(self) -> Sequence[Key]:
        """Every partition reported, in a stable order (the rotation's list)."""

    def moved(self) -> Iterable[Key]:
        """The partitions whose position may have moved since the last call."""

    def report(self, key: Key) -> tuple[int, str] | None:
        """Its position and the incarnation of its topic; None: no longer replicated."""


class WholeMap:
    """``ReplicaPositions`` over a map of every log end, read once per beat: each counts as moved."""

    def __init__(self, log_ends: Callable[[], dict[Key, int]], incarnations: Callable[[], dict[str, str]] = dict) -> None:
        self.log_ends = log_ends
        self.incarnations = incarnations
        self._ends: dict[Key, int] = {}
        self._lives: dict[str, str] = {}

    def keys(self) -> Sequence[Key]:
        self._ends, self._lives = self.log_ends(), self.incarnations()
        return list(self._ends)

    def moved(self) -> Iterable[Key]:
        return self._ends

    def report(self, key: Key) -> tuple[int, str] | None:
        end = self._ends.get(key)
        return None if end is None else (end, self._lives.get(key[0], ""))


class SlaveHeartbeat:
    """Sends heartbeats to the current master and keeps its last answer.

    What a beat reports comes from ``positions`` (the follower's, see the module's "Many
    partitions"), or from a ``log_ends`` map of every partition read each beat."""

    def __init__(
        self,
        broker_id: int,
        slave_id: int,
        epoch: Callable[[], int],
        log_ends: Callable[[], dict[tuple[str, int], int]] = dict,
        interval: float = HEARTBEAT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        key: bytes | None = None,
        incarnations: Callable[[], dict[str, str]] = dict,
        positions: ReplicaPositions | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.key = key
        self.slave_id = slave_id
        self.epoch = epoch
        #: Each partition's log end and the incarnation of its topic (``ReplicaPositions``).
        self.positions: ReplicaPositions = positions if positions is not None else WholeMap(log_ends, incarnations)
        self.interval = interval
        self.clock = clock
        self.target: tuple[str, int] | None = None
        self.master: MasterHeartbeat | None = None
        self.sent = 0
        self.received = 0
        self.bad = 0
        self.last_bad: str | None = None
        self._since = clock()
        self._task: asyncio.Task[None] | None = None
        #: The log end last sent for each partition, and where the rotation goes on next beat.
        self._sent: dict[tuple[str, int], int] = {}
        self._rotation = 0
        #: The next beat names every partition (a new master hears them all at once).
        self._send_all = True
        self._last_sent_at = 0.0

    def retarget(self, address: tuple[str, int] | None) -> None:
        """Follow a new master address (None: no master). Call on the event loop."""
        if address == self.target and (address is None or self.running):
            return
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.target = address
        self.master = None
        self._sent = {}
        self._send_all = True  # a new master hears every log end with the first beat
        self._since = self.clock()
        if address is not None:
            self._task = asyncio.ensure_future(self._run(address))

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def master_silent_for(self) -> float | None:
        """Seconds since the master last answered (or since we started asking); None if no master."""
        if self.target is None:
            return None
        last = self.master.received_at if self.master is not None else self._since
        return max(0.0, self.clock() - last)

    def heartbeat_age_ms(self) -> float | None:
        if self.master is None:
            return None
        return max(0.0, (self.clock() - self.master.received_at) * 1000)

    def message(self) -> bytes:
        """One beat in one datagram: what ``messages`` sends when it fits in one (up to
        ROTATION_MIN partitions of ordinary names)."""
        return self.messages()[0]

    def messages(self) -> list[bytes]:
        """This beat's datagrams: the log ends that moved since they were last sent and the
        next slice of the rotation over all of them, in as many datagrams as they need."""
        due = self._due()
        lives = {key[0]: life for key, _end, life in due if life}
        epoch = self.epoch()
        return [datagram for chunk in _chunks([(key, end) for key, end, _life in due])
                for datagram in self._encode_chunk(chunk, lives, epoch)]

    def _due(self) -> list[tuple[Key, int, str]]:
        """Which log ends this beat sends, with their topic's incarnation (and notes them as sent)."""
        positions = self.positions
        keys = positions.keys()
        moved = positions.moved()
        count = len(keys)
        share = max(ROTATION_MIN, math.ceil(count * self.interval / FULL_REPORT_EVERY_S))
        if share >= count or self._send_all:
            rotation: Sequence[Key] = keys
            self._send_all = False
        else:
            start = self._rotation % count
            rotation = [*keys[start:start + share], *keys[:max(0, start + share - count)]]
            self._rotation = start + share
        in_rotation = set(rotation)
        sent = self._sent
        due = []
        for key in dict.fromkeys([*moved, *rotation]):
            found = positions.report(key)
            if found is None:
                continue
            end, life = found
            if key in in_rotation or sent.get(key) != end:
                due.append((key, end, life))
                sent[key] = end
        if len(sent) > count:  # forgotten partitions: their last ends go too
            live = set(keys)
            self._sent = {key: end for key, end in sent.items() if key in live}
        return due

    def _encode_chunk(self, chunk: list[tuple[tuple[str, int], int]], lives: dict[str, str], epoch: int) -> list[bytes]:
        """``chunk`` as one signed datagram, or halves of it if it does not fit after all."""
        ends = {partition_key(t, p): end for (t, p), end in chunk}
        topics = {topic for (topic, _partition), _end in chunk}
        # Strictly increasing: the master takes a signed heartbeat only if newer than the last.
        sent_at = self._last_sent_at = max(time.time(), self._last_sent_at + 1e-6)
        message = {
            "kind": "hb",
            "role": "slave",
            "broker_id": self.broker_id,
            "slave_id": self.slave_id,
            "epoch": epoch,
            "log_ends": ends,
            "incarnations": {topic: life for topic, life in lives.items() if topic in topics and life},
            "sent_at": sent_at,
            # Room for the answer, which the master never makes bigger than this heartbeat.
            "pad": bytes(REPLY_ROOM_FIXED + sum(len(key) + REPLY_ROOM_PER_PARTITION for key in ends)),
        }
        encoded = encode_signed(message, self.key)
        if len(encoded) <= MAX_DATAGRAM:
            return [encoded]
        if len(chunk) == 1:
            log.warning("heartbeat: the log end of %s/%d does not fit in a datagram; not sent", *chunk[0][0])
            return []
        half = len(chunk) // 2
        return self._encode_chunk(chunk[:half], lives, epoch) + self._encode_chunk(chunk[half:], lives, epoch)

    def handle(self, data: bytes) -> None:
        try:
            message = decode(data, "master", self.key)
            if message["broker_id"] != self.broker_id:
                raise BadHeartbeat(f"answer from broker {message['broker_id']}, expected {self.broker_id}")
        except BadHeartbeat as exc:
            self.bad += 1
            self.last_bad = str(exc)
            log.debug("ignored a bad heartbeat answer: %s", exc)
            return
        self.received += 1
        echo = message.get("echo")
        rtt = None
        if isinstance(echo, (int, float)) and not isinstance(echo, bool):
            rtt = max(0.0, (time.time() - echo) * 1000)
        log_ends, committed = message["_log_ends"], message["_committed"]
        last = self.master
        if last is not None and last.epoch == message["epoch"]:
            # Each answer covers the partitions its heartbeat named: the master's figures of
            # the others are still the last it gave.
            last.log_ends.update(log_ends)
            last.committed.update(committed)
            log_ends, committed = last.log_ends, last.committed
        self.master = MasterHeartbeat(
            self.clock(), message["broker_id"], message["epoch"], message["role"], log_ends, committed, rtt,
        )

    async def _run(self, address: tuple[str, int]) -> None:
        while True:
            stream = None
            try:
                stream = await asyncio_dgram.connect(address)
                receiver = asyncio.ensure_future(self._receive(stream))
                try:
                    while not receiver.done():
                        for datagram in self.messages():
                            await stream.send(datagram)
                            self.sent += 1
                        await asyncio.wait([receiver], timeout=self.interval)
                    receiver.result()  # re-raise its error, if any
                finally:
                    receiver.cancel()
                    await asyncio.gather(receiver, return_exceptions=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # refused (master down), unreachable, ...: try again later
                log.debug("heartbeat to %s:%d: %s", address[0], address[1], exc)
                await asyncio.sleep(self.interval)
            finally:
                if stream is not None:
                    stream.close()

    async def _receive(self, stream: Any) -> None:
        while True:
            data, _addr = await stream.recv()
            self.handle(data)

    def status_pairs(self) -> list[tuple[str, object]]:
        age = self.heartbeat_age_ms()
        silent = self.master_silent_for()
        rtt = self.master.rtt_ms if self.master is not None else None
        return [
            ("master_heartbeat_age_ms", "-" if age is None else f"{age:.0f}"),
            ("master_silent_for_ms", "-" if silent is None else f"{silent * 1000:.0f}"),
            ("master_heartbeat_rtt_ms", "-" if rtt is None else f"{rtt:.2f}"),
            ("master_heartbeats_sent", self.sent),
            ("master_heartbeats_answered", self.received),
            ("master_heartbeats_bad", self.bad),
        ]
