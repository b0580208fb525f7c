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
* HANDING_OVER: the master, writes paused for an operator's hand-over
  (``metaq promote``): it still holds the lock and serves the named slave's
  fetches until that slave holds its whole log (CAUGHT_UP), or gives up
  (ABANDONED: writes resume, the hand-over node is cleared).
* RESIGNED: we gave the lock back (the hand-over's target caught up, or we
  cannot serve); acks nothing; ZooKeeper shows next who leads.
* FENCED: we were leading but lost contact with ZooKeeper (or saw a higher
  epoch): acks stop at once; if the same session comes back with our epoch
  still current we lead again, otherwise we start over (and, since someone else
  now leads, become their slave).

A broker's *preference* (started with or without ``--slave``) only matters for a
group that never had a master: the first master is a broker started without it.

Events, and who decides them (the coordinator applies no rule of its own: every
decision is a row below or one of the pure functions here, named with its event):

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
* HANDOVER_ASKED: an operator's hand-over names a slave to succeed the master of
  our epoch (``handover_event``); only the master acts on it, everyone else
  looks again (an orphan may now be the one named, or no longer).
* CAUGHT_UP / ABANDONED: the hand-over's target holds our whole log, or it did
  not within HANDOVER_TIMEOUT_S (``catch_up_event``).
* CANNOT_LEAD: taking up leading failed for a reason of this broker (a log that
  cannot open), not of ZooKeeper (``entry_failed_event``).
* REEVALUATE: read ZooKeeper afresh and post what it shows.
* STOP: the broker stops.

Transition table. ``X`` means: move to X and run X's entry action (X may be the
current state: the entry action runs again). ``=look`` means: stay, read
ZooKeeper afresh and post what it shows (for STALE_MASTER, after forgetting
which master we follow, so the master seen next counts as changed and we
re-sync against it). ``.`` means ignored, which keeps duplicate and late
ZooKeeper events harmless. Every non-STOPPED state goes to STOPPED on STOP and
looks again on REEVALUATE (columns left out).

    state         SEEN  CHANGED    GONE      ELIGIBLE  WON      LOST      SUSPENDED  RECONN_SAME  RECONN_LOST  SESSION_LOST  HIGHER_EPOCH  STALE_MASTER
    ------------  ----  ---------  --------  --------  -------  --------  ---------  -----------  -----------  ------------  ------------  ------------
    STARTING      .     FOLLOWING  ORPHANED  .         .        .         .          .            .            .             .             .
    FOLLOWING     .     FOLLOWING  ORPHANED  .         .        .         .          .            .            .             .             =look
    ORPHANED      .     FOLLOWING  ORPHANED  ELECTING  .        .         .          .            .            .             .             .
    ELECTING      .     FOLLOWING  .         .         LEADING  ORPHANED  .          .            ORPHANED     ORPHANED      .             .
    LEADING       .     .          FENCED    .         .        .         FENCED     .            FENCED       FENCED        FENCED        .
    HANDING_OVER  .     .          FENCED    .         .        .         FENCED     .            FENCED       FENCED        FENCED        .
    RESIGNED      .     FOLLOWING  ORPHANED  .         .        .         .          .            ORPHANED     ORPHANED      .             .
    FENCED        .     FOLLOWING  ORPHANED  .         .        .         .          LEADING      ORPHANED     ORPHANED      .             .

    state         HANDOVER_ASKED  CAUGHT_UP  ABANDONED  CANNOT_LEAD
    ------------  --------------  ---------  ---------  -----------
    LEADING       HANDING_OVER    .          .          RESIGNED
    HANDING_OVER  .               RESIGNED   (LEADING)  .
    FENCED        =look           .          .          RESIGNED
    (others)      =look           .          .          .

    FENCED + CANNOT_LEAD: fenced while the failed entry's event waited its turn; the lock
    may still be ours, and a broker that cannot serve gives it back all the same.

    ``(LEADING)`` means: move to LEADING without its entry action. An abandoned
    hand-over resumes the term it paused: the lease, the sync set and the master
    registration are still in place, and writes resume at once.

    FOLLOWING + MASTER_CHANGED re-enters FOLLOWING (a new master: truncate against it, then follow).
    ORPHANED + MASTER_GONE re-enters ORPHANED (still no master: ask the election rules again).

Guarantees kept by the coordinator:

* writes are acked only in LEADING, with a valid lease (lease.py); HANDING_OVER
  acks nothing new (what it acked before the pause still completes);
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
    HANDING_OVER = "handing_over"
    RESIGNED = "resigned"
    FENCED = "fenced"
    STOPPED = "stopped"

    # Members are singletons compared by identity: hashed by identity too, in C, instead of
    # Enum's ``__hash__`` (a Python call hashing the name). ``role in ACTING_MASTER`` is asked
    # several times per request (a put's refusal check, a replica fetch's fencing, reads).
    __hash__ = object.__hash__


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
    HANDOVER_ASKED = "handover_asked"
    CAUGHT_UP = "caught_up"
    ABANDONED = "abandoned"
    CANNOT_LEAD = "cannot_lead"
    REEVALUATE = "reevaluate"
    STOP = "stop"


class Step(NamedTuple):
    """What a row says: the state afterwards, and whether to enter it, look at ZooKeeper
    again, or (``enter=False``) only move back to a state whose work is still in place."""

    state: Role
    look_again: bool = False
    enter: bool = True


S, E = Role, Event

#: The rows that enter a state, one line per current state (h11's style); the rows that
#: look again, resume or stop, and those shared by every lock holder, are added below.
ENTERS: dict[Role, dict[Event, Role]] = {
    S.STARTING: {E.MASTER_CHANGED: S.FOLLOWING, E.MASTER_GONE: S.ORPHANED},
    S.FOLLOWING: {E.MASTER_CHANGED: S.FOLLOWING, E.MASTER_GONE: S.ORPHANED},
    S.ORPHANED: {E.MASTER_CHANGED: S.FOLLOWING, E.MASTER_GONE: S.ORPHANED, E.ELIGIBLE: S.ELECTING},
    S.ELECTING: {E.MASTER_CHANGED: S.FOLLOWING, E.WON: S.LEADING, E.LOST: S.ORPHANED,
                 E.RECONNECTED_EPOCH_LOST: S.ORPHANED, E.SESSION_LOST: S.ORPHANED},
    S.LEADING: {E.HANDOVER_ASKED: S.HANDING_OVER, E.CANNOT_LEAD: S.RESIGNED},
    S.HANDING_OVER: {E.CAUGHT_UP: S.RESIGNED},
    S.RESIGNED: {E.MASTER_CHANGED: S.FOLLOWING, E.MASTER_GONE: S.ORPHANED,
                 E.RECONNECTED_EPOCH_LOST: S.ORPHANED, E.SESSION_LOST: S.ORPHANED},
    S.FENCED: {E.MASTER_CHANGED: S.FOLLOWING, E.MASTER_GONE: S.ORPHANED, E.RECONNECTED_SAME_EPOCH: S.LEADING,
               E.RECONNECTED_EPOCH_LOST: S.ORPHANED, E.SESSION_LOST: S.ORPHANED, E.CANNOT_LEAD: S.RESIGNED},
}
TRANSITIONS: dict[tuple[Role, Event], Step] = {
    (state, event): Step(entered) for state, row in ENTERS.items() for event, entered in row.items()
}
TRANSITIONS[(S.FOLLOWING, E.STALE_MASTER)] = Step(S.FOLLOWING, look_again=True)
TRANSITIONS[(S.HANDING_OVER, E.ABANDONED)] = Step(S.LEADING, enter=False)

#: The states in which this run holds the master lock and is registered as master.
HOLDS_LOCK = frozenset({Role.LEADING, Role.HANDING_OVER})
#: The states of a broker that led this term (possibly fenced, or resigning): committed
#: offsets are its own to compute, and slaves fetch from it.
ACTING_MASTER = HOLDS_LOCK | {Role.FENCED, Role.RESIGNED}
#: What may mean the lock is no longer ours: a holder of the lock fences (acks stop at once).
MAY_LOSE_LOCK = (Event.MASTER_GONE, Event.SUSPENDED, Event.RECONNECTED_EPOCH_LOST, Event.SESSION_LOST, Event.HIGHER_EPOCH)

for _state in HOLDS_LOCK:
    for _event in MAY_LOSE_LOCK:
        TRANSITIONS[(_state, _event)] = Step(Role.FENCED)
for _state in Role:
    if _state is not Role.STOPPED:
        TRANSITIONS[(_state, Event.STOP)] = Step(Role.STOPPED)
        TRANSITIONS[(_state, Event.REEVALUATE)] = Step(_state, look_again=True)
        if _state not in (Role.LEADING, Role.HANDING_OVER):
            TRANSITIONS[(_state, Event.HANDOVER_ASKED)] = Step(_state, look_again=True)


def master_event(seen_url: str, following_url: str | None) -> Event:
    """The master znode names ``seen_url`` (not us): the master we follow, or a change."""
    return Event.MASTER_SEEN if seen_url == following_url else Event.MASTER_CHANGED


def reconnected_event(zk_epoch: int, zk_master_url: str | None, our_epoch: int, our_url: str) -> Event:
    """The same session is back: does ZooKeeper still name us master of our epoch?"""
    if zk_epoch == our_epoch and zk_master_url == our_url:
        return Event.RECONNECTED_SAME_EPOCH
    return Event.RECONNECTED_EPOCH_LOST


def handover_event(handover_epoch: int, unclean: bool, serving_epoch: int) -> Event:
    """The hand-over node changed: does it ask the master of our epoch to hand over?

    An unclean hand-over (``--unclean``) is for a group without a master: a master that
    sees one keeps leading (only a clean hand-over pauses it).
    """
    if handover_epoch == serving_epoch and not unclean:
        return Event.HANDOVER_ASKED
    return Event.REEVALUATE


def catch_up_event(state: Role, target_behind: bool, waited_s: float, timeout_s: float) -> Event | None:
    """While handing over: CAUGHT_UP, ABANDONED (too slow, or we left HANDING_OVER), or None (wait)."""
    if state is not Role.HANDING_OVER or (target_behind and waited_s > timeout_s):
        return Event.ABANDONED
    return None if target_behind else Event.CAUGHT_UP


def entry_failed_event(state: Role, zookeeper_error: bool) -> Event | None:
    """An entry action raised: what it means for the machine (None: look again).

    Taking up leading failed because ZooKeeper dropped us (a server losing its quorum let
    our session back in, then closed it): nothing is wrong with this broker, so fence as
    on any lost connection; ZooKeeper decides again once it answers. Any other failure
    to lead is this broker's (a log that cannot open): it gives the lock back.
    """
    if state is not Role.LEADING:
        return None
    return Event.SUSPENDED if zookeeper_error else Event.CANNOT_LEAD


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
