"""The HA role state machine of one broker: pure transitions, no I/O.

Theory of operation
-------------------
Every broker of a group (same ``brokerId``) runs this machine. ZooKeeper alone
decides who is master: the ephemeral ``/brokers/ids/{id}/master`` znode is the
lock, ``/brokers/ids/{id}/epoch`` numbers the masters (see election.py). The
coordinator (coordinator.py) watches ZooKeeper, turns what it sees into events,
feeds them to this machine one at a time, and carries out the result:

* FOLLOWING: replicate from the registered master, after cutting any divergent
  tail of our own log (epoch-based truncation); serve reads up to the master's
  committed offset.
* ORPHANED: a slave with no master registered; serve what we have, and ask the
  election rules whether we may take over.
* ELECTING: try the ZooKeeper transaction that takes the lock and the next epoch.
* LEADING: the master. Acks puts only while the ZooKeeper lease holds.
* FENCED: we were leading but lost contact with ZooKeeper (or saw a higher
  epoch): acks stop at once; if the same session comes back with our epoch
  still current we lead again, otherwise we start over (and, since someone else
  now leads, become their slave).

A broker's *preference* (started with or without ``--slave``) only matters for a
group that never had a master: the first master is a broker started without it.

Events, and who decides them (the coordinator applies no rule of its own: every
decision is a row below or one of the two pure functions here):

* MASTER_SEEN / MASTER_CHANGED: the master znode names another broker;
  ``master_event`` says whether it is the one we already follow.
* MASTER_GONE: no master znode (or our session, and so our lock, is gone).
* ELIGIBLE: the election rules (election.eligibility) let us try to take over.
* WON / LOST: the outcome of the election transaction.
* SUSPENDED: the ZooKeeper connection dropped; the session may be alive.
* RECONNECTED_SAME_EPOCH / RECONNECTED_EPOCH_LOST: the same session is back;
  ``reconnected_event`` says whether ZooKeeper still names us master of our epoch
  (if ZooKeeper does not answer, it says nothing: the coordinator looks again).
* SESSION_LOST: the session expired (a new one was created).
* HIGHER_EPOCH: ZooKeeper or a slave knows a newer epoch than ours.
* STALE_MASTER: the master we follow disagrees with us on the epoch.
* REEVALUATE: read ZooKeeper afresh and post what it shows.
* STOP: the broker stops.

Transition table. ``X`` means: move to X and run X's entry action (X may be the
current state: the entry action runs again). ``=look`` means: stay, read
ZooKeeper afresh and post what it shows (for STALE_MASTER, after forgetting
which master we follow, so the master seen next counts as changed and we
re-sync against it). ``.`` means ignored, which keeps duplicate and late
ZooKeeper events harmless. Every non-STOPPED state goes to STOPPED on STOP and
looks again on REEVALUATE (columns left out).

    state      SEEN  CHANGED    GONE      ELIGIBLE  WON      LOST      SUSPENDED  RECONN_SAME  RECONN_LOST  SESSION_LOST  HIGHER_EPOCH  STALE_MASTER
    ---------  ----  ---------  --------  --------  -------  --------  ---------  -----------  -----------  ------------  ------------  ------------
    STARTING   .     FOLLOWING  ORPHANED  .         .        .         .          .            .            .             .             .
    FOLLOWING  .     FOLLOWING  ORPHANED  .         .        .         .          .            .            .             .             =look
    ORPHANED   .     FOLLOWING  ORPHANED  ELECTING  .        .         .          .            .            .             .             .
    ELECTING   .     FOLLOWING  .         .         LEADING  ORPHANED  .          .            ORPHANED     ORPHANED      .             .
    LEADING    .     .          FENCED    .         .        .         FENCED     .            FENCED       FENCED        FENCED        .
    FENCED     .     FOLLOWING  ORPHANED  .         .        .         .          LEADING      ORPHANED     ORPHANED      .             .

    FOLLOWING + MASTER_CHANGED re-enters FOLLOWING (a new master: truncate against it, then follow).
    ORPHANED + MASTER_GONE re-enters ORPHANED (still no master: ask the election rules again).

Guarantees kept by the coordinator:

* writes are acked only in LEADING, with a valid lease (lease.py);
* LEADING is entered only by winning the election transaction (or by getting
  the same session and epoch back while FENCED), so two brokers can never both
  be LEADING in the same epoch, and epochs only grow;
* FOLLOWING starts with truncation to the master's end of our last epoch, so
  after it our log is a prefix of the master's again.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Role(enum.Enum):
    STARTING = "starting"
    FOLLOWING = "following"
    ORPHANED = "orphaned"
    ELECTING = "electing"
    LEADING = "leading"
    FENCED = "fenced"
    STOPPED = "stopped"


class Event(enum.Enum):
    MASTER_SEEN = "master_seen"
    MASTER_CHANGED = "master_changed"
    MASTER_GONE = "master_gone"
    ELIGIBLE = "eligible"
    WON = "won"
    LOST = "lost"
    SUSPENDED = "suspended"
    RECONNECTED_SAME_EPOCH = "reconnected_same_epoch"
    RECONNECTED_EPOCH_LOST = "reconnected_epoch_lost"
    SESSION_LOST = "session_lost"
    HIGHER_EPOCH = "higher_epoch"
    STALE_MASTER = "stale_master"
    REEVALUATE = "reevaluate"
    STOP = "stop"


class Step(NamedTuple):
    """What a row says: the state afterwards, and whether to enter it or look at ZooKeeper again."""

    state: Role
    look_again: bool = False


S, E = Role, Event

TRANSITIONS: dict[tuple[Role, Event], Step] = {
    (S.STARTING, E.MASTER_CHANGED): Step(S.FOLLOWING),
    (S.STARTING, E.MASTER_GONE): Step(S.ORPHANED),
    (S.FOLLOWING, E.MASTER_CHANGED): Step(S.FOLLOWING),
    (S.FOLLOWING, E.MASTER_GONE): Step(S.ORPHANED),
    (S.FOLLOWING, E.STALE_MASTER): Step(S.FOLLOWING, look_again=True),
    (S.ORPHANED, E.MASTER_CHANGED): Step(S.FOLLOWING),
    (S.ORPHANED, E.MASTER_GONE): Step(S.ORPHANED),
    (S.ORPHANED, E.ELIGIBLE): Step(S.ELECTING),
    (S.ELECTING, E.MASTER_CHANGED): Step(S.FOLLOWING),
    (S.ELECTING, E.WON): Step(S.LEADING),
    (S.ELECTING, E.LOST): Step(S.ORPHANED),
    (S.ELECTING, E.RECONNECTED_EPOCH_LOST): Step(S.ORPHANED),
    (S.ELECTING, E.SESSION_LOST): Step(S.ORPHANED),
    (S.LEADING, E.MASTER_GONE): Step(S.FENCED),
    (S.LEADING, E.SUSPENDED): Step(S.FENCED),
    (S.LEADING, E.RECONNECTED_EPOCH_LOST): Step(S.FENCED),
    (S.LEADING, E.SESSION_LOST): Step(S.FENCED),
    (S.LEADING, E.HIGHER_EPOCH): Step(S.FENCED),
    (S.FENCED, E.MASTER_CHANGED): Step(S.FOLLOWING),
    (S.FENCED, E.MASTER_GONE): Step(S.ORPHANED),
    (S.FENCED, E.RECONNECTED_SAME_EPOCH): Step(S.LEADING),
    (S.FENCED, E.RECONNECTED_EPOCH_LOST): Step(S.ORPHANED),
    (S.FENCED, E.SESSION_LOST): Step(S.ORPHANED),
}
for _state in Role:
    if _state is not Role.STOPPED:
        TRANSITIONS[(_state, Event.STOP)] = Step(Role.STOPPED)
        TRANSITIONS[(_state, Event.REEVALUATE)] = Step(_state, look_again=True)


def master_event(seen_url: str, following_url: str | None) -> Event:
    """The master znode names ``seen_url`` (not us): the master we follow, or a change."""
    return Event.MASTER_SEEN if seen_url == following_url else Event.MASTER_CHANGED


def reconnected_event(zk_epoch: int, zk_master_url: str | None, our_epoch: int, our_url: str) -> Event:
    """The same session is back: does ZooKeeper still name us master of our epoch?"""
    if zk_epoch == our_epoch and zk_master_url == our_url:
        return Event.RECONNECTED_SAME_EPOCH
    return Event.RECONNECTED_EPOCH_LOST


class RoleMachine:
    """Holds the current role; ``handle`` returns the row applied, or None if the event is ignored."""

    def __init__(self) -> None:
        self.state = Role.STARTING

    def handle(self, event: Event) -> Step | None:
        step = TRANSITIONS.get((self.state, event))
        if step is not None:
            self.state = step.state
        return step

    @property
    def may_ack_writes(self) -> bool:
        return self.state is Role.LEADING
