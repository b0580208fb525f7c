"""The fast takeover's pieces (metaq/ha/takeover.py, election._add_deposal): the transition
table, each piece of evidence, and the deposal added to the election transaction."""

from __future__ import annotations

import asyncio
import json
import socket
from types import SimpleNamespace

import pytest
from kazoo.exceptions import NoNodeError

from metaq.ha import takeover
from metaq.ha.election import Deposal, _add_deposal
from metaq.ha.takeover import Phase, Seen, next_phase, probe_port
from metaq.zk.embedded import free_port
from metaq.zk.paths import ZkPaths

from .ha_support import fake_registry

PATHS = ZkPaths("/r")


# --- the transition table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "phase, seen, expected",
    [
        (Phase.IDLE, Seen.FOLLOW, Phase.WATCHING),
        (Phase.WATCHING, Seen.DROPPED, Phase.PROBING),
        (Phase.PROBING, Seen.REFUSED, Phase.CHALLENGING),
        (Phase.PROBING, Seen.ANSWERED, Phase.WATCHING),
        (Phase.PROBING, Seen.SILENT, Phase.STANDBY),
        (Phase.CHALLENGING, Seen.UNANSWERED, Phase.DEAD),
        (Phase.CHALLENGING, Seen.ALIVE, Phase.STANDBY),
        (Phase.DEAD, Seen.FOLLOW, Phase.WATCHING),
        (Phase.STANDBY, Seen.UNFOLLOW, Phase.IDLE),
        (Phase.STANDBY, Seen.RETRY, Phase.WATCHING),
        # Unfollowing on the way to the election keeps the evidence.
        (Phase.DEAD, Seen.UNFOLLOW, Phase.DEAD),
    ],
)
def test_rows(phase, seen, expected):
    assert next_phase(phase, seen) is expected


@pytest.mark.parametrize(
    "phase, seen",
    [
        # Death is only concluded in order: a drop, then a refusal, then ZooKeeper.
        (Phase.WATCHING, Seen.REFUSED),
        (Phase.WATCHING, Seen.UNANSWERED),
        (Phase.PROBING, Seen.UNANSWERED),
        (Phase.IDLE, Seen.DROPPED),
        (Phase.STANDBY, Seen.UNANSWERED),
        (Phase.DEAD, Seen.DROPPED),
    ],
)
def test_everything_else_is_ignored(phase, seen):
    assert next_phase(phase, seen) is None


def test_dead_is_reached_only_through_every_piece_of_evidence():
    """No path from WATCHING to DEAD skips the drop, the refusal or ZooKeeper's word."""
    paths = {(Phase.WATCHING, ())}
    reached: set[tuple[Seen, ...]] = set()
    for _ in range(6):
        grown = set()
        for phase, trail in paths:
            for seen in Seen:
                if seen in (Seen.FOLLOW, Seen.UNFOLLOW, Seen.RETRY):
                    continue
                new = next_phase(phase, seen)
                if new is None:
                    continue
                if new is Phase.DEAD:
                    reached.add(trail + (seen,))
                grown.add((new, trail + (seen,)))
        paths = grown
    assert reached and all(t[-3:] == (Seen.DROPPED, Seen.REFUSED, Seen.UNANSWERED) for t in reached)


# --- the evidence ----------------------------------------------------------------------------


class _Answer:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def get(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.value


class _LivenessZk:
    """Just enough of a kazoo client for a challenge: nodes by path, with their owners."""

    def __init__(self, answer_owner=None, session=5):
        self.nodes: dict[str, int] = {}
        self.answer_owner = answer_owner
        self.client_id = (session, b"password")
        self.watch = None

    def create_async(self, path, value=b"", ephemeral=False, makepath=False):
        self.nodes[path] = self.client_id[0]
        if "/ask-" in path and self.answer_owner is not None:
            # The lock's session answers at once, under its own name.
            answer = path.replace("/ask-", "/ans-") + f"-{self.answer_owner:x}"
            self.nodes[answer] = self.answer_owner
        return _Answer()

    def exists_async(self, path):
        owner = self.nodes.get(path)
        return _Answer(None if owner is None else SimpleNamespace(ephemeralOwner=owner, version=0))

    def delete_async(self, path):
        self.nodes.pop(path, None)
        return _Answer()

    def ensure_path(self, path):
        pass

    def ChildrenWatch(self, path, func):
        self.watch = func


def test_a_challenge_counts_only_the_locks_own_session():
    assert takeover.challenge(_LivenessZk(answer_owner=42), PATHS, 0, owner=42, wait_s=0.05) is not None
    # Another session (a fenced broker of an earlier term) answering does not count.
    assert takeover.challenge(_LivenessZk(answer_owner=99), PATHS, 0, owner=42, wait_s=0.05) is None
    zk = _LivenessZk(answer_owner=None)
    assert takeover.challenge(zk, PATHS, 0, owner=42, wait_s=0.05) is None
    assert zk.nodes == {}, "the challenge cleans up after itself"


def test_only_a_lock_holder_answers_each_challenge_once_under_its_session():
    zk, holds = _LivenessZk(session=0x2A), [False]
    takeover.answer_challenges(zk, PATHS, 0, lambda: holds[0])
    base = takeover.liveness_path(PATHS, 0)
    zk.watch(["ask-a"])
    assert zk.nodes == {}
    holds[0] = True
    zk.watch(["ask-a", "ask-b", "ans-b-2a", "ans-a-63"])  # b answered by us already, a by another session
    assert set(zk.nodes) == {f"{base}/ans-a-2a"}


def test_answer_wait_scales_with_the_session_timeout():
    assert takeover.answer_wait_s(1600) == 0.1
    assert takeover.answer_wait_s(200) == takeover.ANSWER_WAIT_MIN_S
    assert takeover.answer_wait_s(30000) == takeover.ANSWER_WAIT_MAX_S


def test_probe_port_tells_refused_from_answered():
    port = free_port("127.0.0.1")
    assert asyncio.run(probe_port(f"meta://127.0.0.1:{port}")) is Seen.REFUSED
    with socket.create_server(("127.0.0.1", 0)) as listening:
        # Accepted by the kernel's backlog even if nobody calls accept(): like a SIGSTOPped broker.
        bound = listening.getsockname()[1]
        assert asyncio.run(probe_port(f"meta://127.0.0.1:{bound}")) is Seen.ANSWERED


# --- the deposal inside the election transaction -------------------------------------------


class _Client:
    def __init__(self, owner, sync_set=None):
        self.owner, self.sync_set = owner, sync_set

    def exists_async(self, path):
        return _Answer(None if self.owner is None else SimpleNamespace(ephemeralOwner=self.owner, version=0))

    def get_async(self, path):
        if self.sync_set is None:
            return _Answer(error=NoNodeError())
        data = json.dumps({"slaves": sorted(self.sync_set), "epoch": 1, "min": 1}).encode()
        return _Answer((data, SimpleNamespace(version=7)))


class _Tx:
    def __init__(self):
        self.ops = []

    def delete(self, path, version=-1):
        self.ops.append(("delete", path, version))

    def check(self, path, version):
        self.ops.append(("check", path, version))




def test_deposal_deletes_only_the_dead_sessions_lock():
    tx = _Tx()
    assert _add_deposal(_Client(owner=42), PATHS, 0, tx, Deposal(42)) is True
    assert tx.ops == [("delete", PATHS.master(0), 0)]
    tx = _Tx()
    assert _add_deposal(_Client(owner=43), PATHS, 0, tx, Deposal(42)) is False  # another session holds it now
    assert tx.ops == []


def test_deposal_of_an_expired_lock_is_the_ordinary_election():
    tx = _Tx()
    assert _add_deposal(_Client(owner=None), PATHS, 0, tx, Deposal(42)) is True
    assert tx.ops == []


def test_sync_deposal_checks_the_sync_set_still_names_us():
    tx = _Tx()
    assert _add_deposal(_Client(owner=42, sync_set={1}), PATHS, 0, tx, Deposal(42, sync_member=1)) is True
    assert ("check", PATHS.sync_set(0), 7) in tx.ops
    for sync_set in ({2}, None):
        tx = _Tx()
        assert _add_deposal(_Client(owner=42, sync_set=sync_set), PATHS, 0, tx, Deposal(42, sync_member=1)) is False
        assert tx.ops == []


# --- evidence that cannot be used is dropped ----------------------------------------------------
# Campaign seed 5100 (load average 50): a sync slave's challenge to its live master went
# unanswered within 94 ms; the slave took the master for dead, was not eligible (the master had
# just dropped it from the sync set), and kept the evidence: every later event naming that
# live session was ignored as "its process died", and the slave never followed again.

MASTER_URL = "meta://127.0.0.1:9100"


def _death_watch(session_timeout_ms: int = 1500) -> takeover.DeathWatch:
    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta", session_timeout_ms=session_timeout_ms))
    host = SimpleNamespace(config=config, registry=SimpleNamespace(client=object()))
    return takeover.DeathWatch(host, PATHS, on_dead=lambda: None)  # type: ignore[arg-type]


def test_evidence_older_than_the_session_timeout_names_no_dead_session(monkeypatch):
    import time

    monkeypatch.setattr(takeover, "lock_owner", lambda *_: 7)  # the session still holds the lock
    watch = _death_watch()
    fresh = takeover.DeadMaster(MASTER_URL, 7, time.monotonic())
    watch.dead, watch.phase = fresh, Phase.DEAD
    assert asyncio.run(watch.names_dead_session(MASTER_URL)) == fresh
    # Past the session timeout, ZooKeeper would have expired a dead session: this one lives.
    watch.dead = takeover.DeadMaster(MASTER_URL, 7, time.monotonic() - 1.6)
    assert asyncio.run(watch.names_dead_session(MASTER_URL)) is None
    assert watch.dead is None and watch.phase is Phase.IDLE


def test_an_orphan_that_may_not_take_over_looks_again_once_the_evidence_is_stale_and_follows_the_live_master(monkeypatch):
    import time

    from metaq.ha import coordinator as coordinator_module
    from metaq.ha import group_view as group_view_module
    from metaq.ha.coordinator import HaCoordinator
    from metaq.ha.progress import ReplicationProgress
    from metaq.ha.role import Role

    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta", session_timeout_ms=1500),
                             replication_mode="sync", auto_failover=True, data_path="/nonexistent")
    host = SimpleNamespace(config=config, registry=fake_registry("meta://127.0.0.1:9200", slave_id=1),
                           store=SimpleNamespace(logs=lambda: []))
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]
    coordinator.machine.state = Role.ORPHANED
    from metaq.zk.group import GroupState

    state = GroupState(master_url=MASTER_URL, epoch=3, epoch_version=2, leader_url=MASTER_URL,
                       sync_set=frozenset(), sync_set_epoch=3)
    monkeypatch.setattr(group_view_module, "read_group_state", lambda *_: state)
    monkeypatch.setattr(group_view_module, "read_handover", lambda *_: None)
    monkeypatch.setattr(coordinator_module, "eligibility", lambda **_: (False, "not in the last sync set []"))
    monkeypatch.setattr(takeover, "lock_owner", lambda *_: 7)

    async def no_claims(*_):
        return {}

    coordinator.candidacy = SimpleNamespace(post_reseed_claim=no_claims, ranks_candidates=lambda *_: False)
    death_watch = coordinator.followership.death_watch
    # The evidence is 1.4 s old and the session timeout 1.5 s: a dead session has 0.1 s left.
    death_watch.dead = takeover.DeadMaster(MASTER_URL, 7, time.monotonic() - 1.4)
    death_watch.phase = Phase.DEAD
    from metaq.ha.role import Event

    def drain() -> list:
        queued = []
        while not coordinator._events.empty():
            queued.append(coordinator._events.get_nowait())
        return queued

    async def scenario() -> tuple[bool, list, list, list]:
        coordinator._loop = asyncio.get_running_loop()
        first = await coordinator._consider_election()
        at_once = drain()
        await asyncio.sleep(0.5)  # the look again scheduled for when the session would have expired
        later = drain()
        await coordinator._consider_election()  # that look: the session still holds the lock
        return first, at_once, later, drain()

    first, at_once, later, after = asyncio.run(scenario())
    assert first is False and at_once == [], "not eligible: nothing to do until the session would have expired"
    assert [event for event, _detail in later] == [Event.REEVALUATE], "a look again is scheduled"
    assert death_watch.dead is None, "then the evidence is stale: the session lives"
    assert [detail for _event, detail in after] == [MASTER_URL], "and the live master is followed again"


def test_an_orphan_with_fresh_evidence_asks_the_election_rules_again_on_each_look(monkeypatch):
    """A candidate waiting for the other slaves' log ends (async failover) looks again every
    50 ms: each look reads the master node, which still names the session the evidence calls
    dead. That look must reach the election rules again (MASTER_GONE: ORPHANED re-enters);
    ignored as MASTER_SEEN, the wait stopped at its first look and the orphan waited for a
    ZooKeeper event (campaign seed 7102: 2 minutes, beside a master that lived)."""
    import time

    from metaq.ha.coordinator import HaCoordinator
    from metaq.ha.progress import ReplicationProgress
    from metaq.ha.role import Event, Role

    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta", session_timeout_ms=1500),
                             replication_mode="async", auto_failover=True, data_path="/nonexistent")
    host = SimpleNamespace(config=config, registry=fake_registry("meta://127.0.0.1:9200", slave_id=1),
                           store=SimpleNamespace(logs=lambda: []))
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]
    monkeypatch.setattr(takeover, "lock_owner", lambda *_: 7)  # the session the evidence names holds the lock
    death_watch = coordinator.followership.death_watch
    death_watch.dead = takeover.DeadMaster(MASTER_URL, 7, time.monotonic())
    death_watch.phase = Phase.DEAD

    async def decided(role: Role) -> Event:
        coordinator.machine.state = role
        coordinator._post_master(MASTER_URL)
        decide, _detail = coordinator._events.get_nowait()
        return await decide()

    assert asyncio.run(decided(Role.ORPHANED)) is Event.MASTER_GONE
    assert coordinator.machine.handle(Event.MASTER_GONE).state is Role.ORPHANED  # re-entered: the rules again
    # Elsewhere the look changes nothing (a follower was told MASTER_GONE by the death watch itself).
    assert asyncio.run(decided(Role.FOLLOWING)) is Event.MASTER_SEEN


def test_a_master_read_before_a_takeover_is_not_followed_once_the_new_master_is(monkeypatch):
    """An orphan's election look reads the dead master's node; before it asks who owns that
    node, a slave's takeover replaces it (the evidence then names no session) and the look
    posts the dead master's address. The new master's watch event is handled first: we follow
    it. The late post must not be decided against the master node's old content: followed, it
    left the new master for the dead address, then a slave restarted there, for 60 s out of
    the sync set (campaign seed 7209). It asks ZooKeeper again instead."""
    import time

    from metaq.ha import group_view as group_view_module
    from metaq.ha.coordinator import HaCoordinator
    from metaq.ha.progress import ReplicationProgress
    from metaq.ha.role import Event, Role
    from metaq.zk.group import GroupState

    new_url, third_url = "meta://127.0.0.1:9300", "meta://127.0.0.1:9400"
    config = SimpleNamespace(broker_id=0, zk=SimpleNamespace(root="/meta", session_timeout_ms=1500),
                             replication_mode="sync", auto_failover=True, data_path="/nonexistent")
    host = SimpleNamespace(config=config, registry=fake_registry("meta://127.0.0.1:9200", slave_id=2),
                           store=SimpleNamespace(logs=lambda: []))
    coordinator = HaCoordinator(host, None, ReplicationProgress())  # type: ignore[arg-type]

    def state_naming(url: str, epoch: int) -> GroupState:
        return GroupState(master_url=url, epoch=epoch, epoch_version=epoch, leader_url=url,
                          sync_set=frozenset({0, 2}), sync_set_epoch=epoch)

    zk = {"state": state_naming(MASTER_URL, 2)}
    monkeypatch.setattr(group_view_module, "read_group_state", lambda *_: zk["state"])

    def lock_owner(*_args):
        zk["state"] = state_naming(new_url, 3)  # the takeover commits between the two reads
        return None  # the node names the new master: no session of the dead one holds it

    monkeypatch.setattr(takeover, "lock_owner", lock_owner)
    death_watch = coordinator.followership.death_watch
    death_watch.dead = takeover.DeadMaster(MASTER_URL, 7, time.monotonic())
    death_watch.phase = Phase.DEAD

    async def scenario() -> tuple[Event, Event]:
        coordinator._loop = asyncio.get_running_loop()
        coordinator.machine.state = Role.ORPHANED
        assert await coordinator._consider_election() is False
        late, detail = coordinator._events.get_nowait()
        assert detail == MASTER_URL, "the look posted the address it read before the takeover"
        # Meanwhile the new master's watch event was handled: we follow it (the evidence went).
        coordinator.machine.state, coordinator.master_url = Role.FOLLOWING, new_url
        death_watch.forget()
        stale = await late()
        zk["state"] = state_naming(third_url, 4)  # a master ZooKeeper does name is still followed
        coordinator._post_master(third_url)
        fresh, _detail = coordinator._events.get_nowait()
        return stale, await fresh()

    stale, fresh = asyncio.run(scenario())
    assert stale is Event.REEVALUATE, "ZooKeeper is asked again: it names the master we follow"
    assert coordinator.machine.handle(stale).look_again
    assert fresh is Event.MASTER_CHANGED


def test_a_silent_probe_after_a_drop_is_asked_again_before_standing_by(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connect that timed out may be our own loop's delay on a loaded machine: asked again, a
    dead process's port refuses (on to the challenge); a silent host stays silent (stand by)."""
    answers: list[takeover.Seen] = []

    async def probe(_url: str, timeout: float = takeover.PROBE_TIMEOUT_S) -> takeover.Seen:
        return answers.pop(0)

    monkeypatch.setattr(takeover, "probe_port", probe)
    answers[:] = [takeover.Seen.SILENT, takeover.Seen.REFUSED]
    assert asyncio.run(takeover.probe_after_drop("meta://127.0.0.1:1")) is takeover.Seen.REFUSED
    answers[:] = [takeover.Seen.SILENT] * (1 + takeover.SILENT_PROBES_AGAIN) + [takeover.Seen.REFUSED]
    assert asyncio.run(takeover.probe_after_drop("meta://127.0.0.1:1")) is takeover.Seen.SILENT
    assert answers == [takeover.Seen.REFUSED], "bounded: asked again SILENT_PROBES_AGAIN times, no more"
