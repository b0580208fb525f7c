"""The FOLLOWING entry action and what it owns: registration as a slave, truncation, the follower.

Theory of operation
-------------------
The coordinator (coordinator.py) enters FOLLOWING(url) when ZooKeeper names another
broker master. ``follow`` then, in this order:

1. registers this broker as ``slave{k}`` (its ``--slave`` id, or the smallest free one
   for a broker started without it);
2. reads the group's epoch and serves in it (``Epochs.serve``: replica fetches carry it);
3. per partition, asks the master where our last epoch ends in its log and truncates
   there (truncation.divergence_point; the removed tail is kept in a ``truncated-*``
   file), then copies the master's epoch history (``adopt_master_epochs``): after this
   our log is a prefix of the master's (invariant, role.py). Each answer is used only if
   it says it comes from the acting master in the epoch read in step 2 (answerer.py):
   the broker at the master node's address may be a deposed master or a slave, whose
   history is another log's. Otherwise nothing more is cut, the refusal is logged once,
   and after a wait (doubling, REFUSED_WAIT_FIRST_S to REFUSED_WAIT_MAX_S) following gives
   up with MasterSuperseded: the coordinator reads the master node again (ZooKeeper
   decides whom we follow, never the peer's answer).
   A partition the master answers with an error (it does not serve it) is held back, the others go on:
   the follower's start of it truncates it first, once the master serves it (``held_back``);
4. records what the truncation cut in ZooKeeper (failover_record.py, in the background);
5. follows with the replication follower (follower.py), created on first use and again
   when our slave id changed; and watches the master's process (takeover.py).

``unfollow`` stops replicating (reads stay up) before anything else appends: before
truncating again, and before leading. ``stop`` ends the follower for good (broker stop).

Owns: the follower, the death watch of the master we follow, the truncation list
(``status_pairs``), and the follower's start task (awaited on stop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Callable

from ..client.connection import BrokerConnection, ConnectionClosed
from ..config import SlaveConfig
from ..owned_tasks import OwnedTasks
from ..protocol.messages import EpochsRequest
from ..zk.group import ZK_CALL_TIMEOUT_S
from .answerer import NotTheMaster, check_master_answer
from .epochs import EpochCache
from .failover_record import now_ms, write_truncation
from .follower import MasterFollower
from .group_view import GroupView
from .host import BrokerHost, PartitionOwner
from .peers import open_peer
from .role import Event
from .takeover import DeathWatch
from .terms import Epochs
from .truncation import TruncationRefused, divergence_point

log = logging.getLogger(__name__)

#: After a peer at the master's address answered as something else than the acting master of
#: ZooKeeper's epoch: the first wait before the master node is read again, and the longest.
REFUSED_WAIT_FIRST_S = 0.1
REFUSED_WAIT_MAX_S = 2.0


class MasterSuperseded(ConnectionError):
    """Following was given up because an event is waiting for the coordinator (STOP, too)."""


class Followership:
    def __init__(self, host: BrokerHost, view: GroupView, epochs: Epochs, slave: SlaveConfig | None,
                 post: Callable[..., None]) -> None:
        self.host = host
        self.view = view
        self.epochs = epochs
        self.slave_template = slave
        #: The replication follower, created the first time this broker follows.
        self.follower: MasterFollower | None = None
        #: Every partition tail truncation cut since start (the last few are in ``metaq status``).
        self.truncations: list[dict[str, Any]] = []
        #: Set by the coordinator's stop(): waiting for an unreachable master gives up at once.
        self.stopping = False
        #: True while an event waits for the coordinator (the master node changed, say): waiting
        #: for the master we set out to follow gives up at once, so that the event is handled.
        self.superseded: Callable[[], bool] = lambda: False
        #: Watches the master we follow for the death of its process (takeover.py): on complete
        #: evidence, an orphan may depose the dead session's lock instead of waiting for its expiry.
        self.death_watch = DeathWatch(host, view.paths, on_dead=lambda: post(Event.MASTER_GONE))
        self._post = post
        self._tasks = OwnedTasks("followership")
        #: The connection the truncation asks the master on, while it runs (``give_up``).
        self._truncating: BrokerConnection | None = None
        #: The group's epoch as ZooKeeper named it when following began: answers about the log
        #: (``epoch_end``, ``epochs``) are used only from the acting master in this epoch.
        self.master_epoch = 0
        #: Refusals in a row from brokers that answered as not the master, and the last one said
        #: (logged once; the wait before reading ZooKeeper again grows with the count).
        self._refusals = 0
        self._refusal_said: tuple[Any, ...] | None = None
        #: Partitions the master refused during the truncation (it does not serve them: their
        #: files lost, say), with its answer: not followed until a truncation of theirs works,
        #: which the follower's start of each asks for again (``adopt_master_epochs``).
        self.held_back: dict[tuple[str, int], str] = {}

    def cache(self, topic: str, partition: int) -> EpochCache:
        return self.host.partitions.get(topic, partition).epochs

    # --- the entry action -----------------------------------------------------------------

    async def follow(self, url: str) -> None:
        """Register as a slave, truncate against the master at ``url``, then replicate from it."""
        await self.ensure_slave_registration()
        state = await self.view.read_state()
        self.epochs.saw(state.epoch)
        self.epochs.serve()
        self.master_epoch = state.epoch  # ZooKeeper's: answers count only from its acting master
        cut_before = len(self.truncations)
        await self.truncate_against(url)
        self._record_truncation(self.truncations[cut_before:])
        self.epochs.followed_in()
        follower = await self._ensure_follower(self._slave_config())
        await follower.follow(url)
        self.death_watch.watch(url)

    async def unfollow(self) -> None:
        """Stop replicating (reads stay up): nothing may append while we truncate or lead."""
        self.death_watch.unwatch()
        if self.follower is not None:
            await self.follower.unfollow()

    def give_up(self) -> None:
        """The broker is stopping: an entry action under way ends now, not at its deadline.

        The truncation walks every partition with two round trips to the master each (18 s
        at 10,000 partitions on a loaded machine; a silent master holds one for up to its
        10 s timeout): it stops before the next partition, and the request in flight fails.
        Each partition's cut is whole (a partition whose epoch copy did not happen is not
        followed); the next start truncates again from the first partition.
        """
        self.stopping = True
        if self._truncating is not None:
            self._truncating.abandon("this broker is stopping")

    async def stop(self) -> None:
        self.death_watch.unwatch()
        if self.follower is not None:
            await self.follower.stop()
        await self._tasks.stop(ZK_CALL_TIMEOUT_S)  # the follower's start: its watch is armed by then

    def replicas_healthy(self) -> bool:
        """No replica stopped on an error it cannot get past (the election rules ask)."""
        follower = self.follower
        return follower is None or not any(r.stopped for r in follower.replicas.values())

    def never_caught_up(self) -> tuple[str, ...]:
        """Partitions whose replica never reached the master's log end since we started."""
        return () if self.follower is None else tuple(self.follower.never_caught_up())

    def lag_bytes(self) -> int | None:
        return self.follower.lag_bytes() if self.follower is not None else None

    def forget_partitions(self, keys: list[tuple[str, int]]) -> None:
        if self.follower is not None:
            self.follower.forget_partitions(keys)

    async def _ensure_follower(self, slave: SlaveConfig) -> MasterFollower:
        """The replication follower (created on first use, and again if our slave id changed)."""
        if self.follower is None or self.follower.slave.slave_id != slave.slave_id:
            if self.follower is not None:
                # Stopped, not dropped: its heartbeats and checksum watch would otherwise go on
                # under the old slave id beside the new follower's.
                await self.follower.stop()
            self.follower = MasterFollower(
                self.host, slave, self.view.zk, self.view.paths,
                epoch=lambda: self.epochs.serving,
                adopt_epochs=self.adopt_master_epochs,
                # The master and we disagree on the epoch: look at ZooKeeper again and re-sync.
                on_stale_master=lambda: self._post(Event.STALE_MASTER),
            )
            self._tasks.spawn(self.follower.start())
        return self.follower

    # --- slave identity -------------------------------------------------------------------

    def _slave_config(self) -> SlaveConfig:
        slave_id = self.host.registry.slave_id
        assert slave_id is not None
        if self.slave_template is not None:
            return replace(self.slave_template, slave_id=slave_id)
        return SlaveConfig(slave_id=slave_id, slave_group=f"meta-slave-group_{slave_id}")

    async def ensure_slave_registration(self) -> None:
        """Be registered as a slave (a broker without ``--slave`` takes the smallest free id)."""
        registry = self.host.registry
        if registry.slave_id is not None:
            return
        if self.slave_template is not None:
            slave_id = self.slave_template.slave_id
        else:
            slave_id = await self.view.free_slave_id()
        await registry.set_role(slave_id)

    # --- truncation and epoch adoption ----------------------------------------------------

    async def truncate_against(self, url: str) -> None:
        """Cut every local log back to where it stops agreeing with the master's."""
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = await open_peer(self.host, url, self.host.registry.slave_id, timeout=3)
                break
            except ConnectionClosed as exc:
                if time.monotonic() > deadline or self.stopping:
                    raise
                if self.superseded():
                    # An event waits (the group has another master, or none): a dead master's
                    # port refuses us until the deadline, and meanwhile this broker followed
                    # nobody (campaign seed 6201: 63 s out of the sync set of the new master).
                    raise MasterSuperseded(f"stopped waiting for the master at {url} ({exc}): the group changed meanwhile") from None
                log.info("waiting for the master at %s: %s", url, exc)
                await asyncio.sleep(0.2)
        self._truncating = conn
        refused: dict[tuple[str, int], str] = {}
        owners = self.host.partitions.owners()
        try:
            for owner in owners:
                try:
                    if not self.stopping:
                        await self._truncate_partition(conn, owner)
                except ConnectionClosed:
                    if not self.stopping:
                        raise
                except (TruncationRefused, NotTheMaster):
                    raise  # about the master (or our log), not about this partition
                except ConnectionError as exc:
                    # The master answered, refusing this partition (a 500 for a partition whose
                    # files it lost): the others are followed. Before, one such partition failed
                    # the whole entry action, again and again, and the slave replicated nothing
                    # (a netns campaign run: 120 s behind on every partition).
                    refused[owner.key] = str(exc)
                if self.stopping:
                    raise MasterSuperseded(f"stopped truncating against the master at {url}: this broker is stopping")
        except NotTheMaster as exc:
            raise await self._not_the_master(exc) from None
        finally:
            self._truncating = None
            conn.close()
        if owners and len(refused) == len(owners):
            # Every partition refused says something about the master (it no longer leads, say),
            # not about a partition: the entry action fails and the coordinator looks again.
            raise ConnectionError(f"the master at {url} refused every partition: {next(iter(refused.values()))}")
        for key, reason in refused.items():
            log.error("%s-%d is not followed: the master at %s refused it (%s); the other partitions are followed, "
                      "this one once the master serves it again (truncated against it first)", *key, url, reason)
        self.held_back = refused
        self._refusals, self._refusal_said = 0, None

    async def _not_the_master(self, exc: NotTheMaster) -> MasterSuperseded:
        """The broker at the master's address answered as something else than the acting master
        of ZooKeeper's epoch: said once (a new refusal is said again), then, after a wait that
        doubles with each refusal in a row, following ends and the coordinator reads the master
        node again. The wait ends early only when the broker stops, not when an event is queued:
        the coordinator's own next look (a REEVALUATE, a decision on the same master node) is
        nearly always queued by then, and cutting the wait for it made every retry 0.2 s apart."""
        wait = min(REFUSED_WAIT_FIRST_S * 2 ** self._refusals, REFUSED_WAIT_MAX_S)
        self._refusals += 1
        if exc.key != self._refusal_said:
            self._refusal_said = exc.key
            log.warning("%s; nothing more is truncated: reading the group's master from ZooKeeper again", exc)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self.stopping:
            await asyncio.sleep(min(0.05, wait))
        return MasterSuperseded(f"the broker at {exc.address} is not the acting master of epoch {exc.expected_epoch}")

    async def _truncate_partition(self, conn: BrokerConnection, owner: PartitionOwner) -> None:
        """Cut one partition where it stops agreeing with the master, then copy the master's epoch
        history. Its owner is the one registry asked: the log compared, the history and the cut
        are its own, so an ``await`` in between cannot pair one incarnation's log with another's
        owner; a partition dropped meanwhile (its topic deleted or re-created) is left alone."""
        topic, partition = owner.key
        floor = self.follower.committed_seen(topic, partition) if self.follower is not None else 0
        owner.truncate_corrupt()  # corrupt bytes (scrub, recovery) cannot be compared: fetched again
        end = await divergence_point(conn, topic, partition, owner.log, owner.epochs, floor, master_epoch=self.master_epoch)
        if owner.dropped:
            return
        if end < owner.log.log_end:
            removed = owner.log.log_end - end
            aside = owner.truncate_to(end)  # the epoch history follows
            record = {"topic": topic, "partition": partition, "offset": end, "bytes": removed, "file": str(aside)}
            self.truncations.append(record)
            log.warning("truncated %s-%d at %d: %d divergent bytes moved aside to %s", topic, partition, end, removed, aside)
        entries = await self._master_epochs(conn, topic, partition)
        if not owner.dropped:
            await owner.adopt_epochs(entries)
        self.held_back.pop(owner.key, None)

    def _record_truncation(self, cut: list[dict[str, Any]]) -> None:
        """Record what following this epoch cut: always for a broker that led since it last
        followed (an old master rejoining; 0 bytes is worth saying), else only if bytes went."""
        slave_id = self.host.registry.slave_id
        epochs = self.epochs
        if slave_id is None or not (cut or epochs.led > epochs.followed):
            return
        broker_id = self.view.broker_id
        partitions = {f"{t['topic']}-{broker_id}-{t['partition']}": t["bytes"] for t in cut}
        record = {"at_ms": now_ms(), "url": self.view.my_url, "slave_id": slave_id, "led_epoch": epochs.led, "partitions": partitions}
        self.view.record_later(f"the truncation record of epoch {epochs.seen}", write_truncation, epochs.seen, slave_id, record)

    async def adopt_master_epochs(self, conn: BrokerConnection, topic: str, partition: int) -> None:
        """Copy the master's epoch history of a partition we follow (our bytes are its bytes);
        a partition held back is first truncated against the master (a refusal raises: the
        follower's start of it fails and is tried again)."""
        if (topic, partition) in self.held_back:
            await self._truncate_partition(conn, self.host.partitions.get(topic, partition))
            log.info("%s-%d: the master serves it again; truncated against it, now followed", topic, partition)
            return
        await self.host.partitions.adopt_epochs(topic, partition, await self._master_epochs(conn, topic, partition))

    async def _master_epochs(self, conn: BrokerConnection, topic: str, partition: int) -> list[tuple[int, int]]:
        """The master's epoch history of a partition (``epochs``), only from the acting master of
        the epoch ZooKeeper named (NotTheMaster otherwise: another member's history is no copy)."""
        reply = await conn.request(EpochsRequest(topic=topic, partition=partition).to_header(), timeout=10)
        check_master_answer(reply, conn.address, f"epochs {topic}-{partition}", self.master_epoch)
        if not reply.ok:
            raise ConnectionError(f"epochs {topic}-{partition}: {reply.code} {reply.message}")
        return [(int(e), int(s)) for e, s in reply["entries"]]
