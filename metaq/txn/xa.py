"""The state machine of one transaction branch (XA / JTA rules): pure transitions, no I/O.

Theory of operation
-------------------
Every transaction this broker group takes part in is one *branch* with an id
(``xid``: an application XA ``Xid`` rendered as ``XID:{formatId}:{gtrid hex}:{bqual hex}``,
or ``TX:{producerId}.{epoch}:{n}`` for a local transaction). The transaction
coordinator (coordinator.py) keeps one state per branch, turns every client
request and every timer into an event, looks the pair up in ``TRANSITIONS`` and
carries out the row: reply with its XA code, and append the marker the row names
(PREPARE, COMMIT or ABORT) to every partition the branch wrote to. A pair that
is not in the table is a protocol error (``XAER_PROTO``) and changes nothing.

Local transactions (MetaQ's ``TransactionalProducer``: begin, send, commit,
rollback) use the same machine: begin = START, send = SEND, commit = END then
COMMIT_ONE_PHASE, rollback = END then ROLLBACK.

XA rules that apply (X/Open XA, as JTA's XAResource exposes them):

* xa_start without flags creates the branch (an existing one: XAER_DUPID);
  TMJOIN / TMRESUME re-associate an idle branch (START_JOIN);
* work (SEND) only while associated (ACTIVE);
* xa_end(TMSUCCESS / TMSUSPEND) dissociates (IDLE); xa_end(TMFAIL) marks the
  branch rollback-only, and any later prepare or commit rolls it back (XA_RB*);
* xa_prepare only on an idle branch; a branch with no work votes read-only
  (XA_RDONLY) and is finished at once; commit(onePhase) only on an idle,
  unprepared branch; commit(twoPhase) only on a prepared one;
* xa_rollback on an idle, rollback-only or prepared branch (not while associated);
* a resource manager may roll back an unprepared branch on its own (timeout, or
  here: a failover before prepare); later calls get XA_RB*;
* xa_recover lists prepared and heuristically completed branches;
* a heuristic decision is remembered until xa_forget.

Where this machine goes beyond plain XA (each says why):

* a prepared branch whose timeout (capped by ``maxTxTimeoutInSeconds``) passes is
  rolled back, as MetaQ does, and reported as a heuristic rollback (XA_HEURRB)
  until forgotten, so the transaction manager learns the outcome;
* a commit retried on a committed branch, or a rollback on a rolled-back one,
  answers XA_OK: after a failover the client cannot know whether its first try
  reached the old master, and the outcome is in the replicated log;
* a finished branch (COMMITTED, ROLLED_BACK) is a tombstone: its id may start
  a new branch (START), every other request is answered from the outcome.

Transition table. A cell ``X/code`` means: move to X and reply code; ``.`` for X
keeps the state; ``+P``, ``+C``, ``+A``: append a PREPARE, COMMIT or ABORT marker
to every partition the branch wrote to (before replying); ``-`` is XAER_PROTO
(state kept). States: NX nonexistent, AC active, ID idle, RO rollback-only,
PR prepared, CM committed, RB rolled back, HR heuristically rolled back. Codes:
ok, rdonly, rb (XA_RBROLLBACK), rbto (XA_RBTIMEOUT), heur (XA_HEURRB), nota,
dup (XAER_DUPID).

         START   JOIN    SEND    END     END_FAIL PREPARE  PREP_RO    COMMIT_1P COMMIT   ROLLBACK TIMEOUT    FAILOVER FORGET
    NX   AC/ok   ./nota  ./nota  ./nota  ./nota   ./nota   ./nota     ./nota    ./nota   ./nota   ./ok       ./ok     ./nota
    AC   ./dup   -       ./ok    ID/ok   RO/ok    -        -          -         -        -        RB/rbto+A  RB/rb+A  -
    ID   ./dup   AC/ok   -       -       -        PR/ok+P  NX/rdonly  CM/ok+C   -        RB/ok+A  RB/rbto+A  RB/rb+A  -
    RO   ./dup   ./rb    ./rb    -       -        RB/rb+A  RB/rb+A    RB/rb+A   -        RB/ok+A  RB/rbto+A  RB/rb+A  -
    PR   ./dup   -       -       -       -        -        -          -         CM/ok+C  RB/ok+A  HR/heur+A  ./ok     -
    CM   AC/ok   -       -       -       -        -        -          ./ok      ./ok     -        ./ok       ./ok     ./nota
    RB   AC/ok   ./rb    ./rb    ./rb    ./rb     ./rb     ./rb       ./rb      ./rb     ./ok     ./ok       ./ok     ./nota
    HR   ./dup   -       -       -       -        -        -          -         ./heur   ./heur   ./ok       ./ok     NX/ok

JOIN is xa_start(TMJOIN or TMRESUME); PREP_RO is a prepare of a branch that wrote
nothing; FAILOVER is posted by ``reconcile`` for a branch found unprepared when a
broker starts or takes over.

Guarantees the coordinator keeps with it: a branch's records become readable
only through a COMMIT marker (``+C``), which is appended only by a COMMIT or
COMMIT_ONE_PHASE row; every row that ends a branch unsuccessfully appends ABORT,
so the last stable offset never waits for a dead branch.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class State(enum.Enum):
    NONEXISTENT = "nonexistent"
    ACTIVE = "active"
    IDLE = "idle"
    ROLLBACK_ONLY = "rollback_only"
    PREPARED = "prepared"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    HEURISTIC_ROLLED_BACK = "heuristic_rolled_back"


class Event(enum.Enum):
    START = "start"
    START_JOIN = "start_join"
    SEND = "send"
    END = "end"
    END_FAIL = "end_fail"
    PREPARE = "prepare"
    PREPARE_READ_ONLY = "prepare_read_only"
    COMMIT_ONE_PHASE = "commit_one_phase"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    TIMEOUT = "timeout"
    FAILOVER = "failover"
    FORGET = "forget"


class Code(enum.IntEnum):
    """XA return codes (the values of the XA specification and javax.transaction.xa.XAException)."""

    XA_OK = 0
    XA_RDONLY = 3
    XA_RBROLLBACK = 100
    XA_RBTIMEOUT = 106
    XA_HEURRB = 6
    XAER_PROTO = -6
    XAER_NOTA = -4
    XAER_DUPID = -8
    XAER_RMERR = -3  # the coordinator's own refusal (timeout capacity), never a table row
    XAER_INVAL = -5  # the client's refusal of an invalid argument (a negative timeout), never a table row


class Marker(enum.Enum):
    PREPARE = "prepare"
    COMMIT = "commit"
    ABORT = "abort"


class Step(NamedTuple):
    state: State
    code: Code
    marker: Marker | None = None


S, E, C, M = State, Event, Code, Marker
_REQUESTS = [e for e in Event if e not in (E.TIMEOUT, E.FAILOVER)]

TRANSITIONS: dict[tuple[State, Event], Step] = {}
# A branch we do not know: every request is XAER_NOTA; timers and failover find nothing to do.
for _event in _REQUESTS:
    TRANSITIONS[(S.NONEXISTENT, _event)] = Step(S.NONEXISTENT, C.XAER_NOTA)
TRANSITIONS.update({
    (S.NONEXISTENT, E.START): Step(S.ACTIVE, C.XA_OK),
    (S.NONEXISTENT, E.TIMEOUT): Step(S.NONEXISTENT, C.XA_OK),
    (S.NONEXISTENT, E.FAILOVER): Step(S.NONEXISTENT, C.XA_OK),

    (S.ACTIVE, E.START): Step(S.ACTIVE, C.XAER_DUPID),
    (S.ACTIVE, E.SEND): Step(S.ACTIVE, C.XA_OK),
    (S.ACTIVE, E.END): Step(S.IDLE, C.XA_OK),
    (S.ACTIVE, E.END_FAIL): Step(S.ROLLBACK_ONLY, C.XA_OK),
    (S.ACTIVE, E.TIMEOUT): Step(S.ROLLED_BACK, C.XA_RBTIMEOUT, M.ABORT),
    (S.ACTIVE, E.FAILOVER): Step(S.ROLLED_BACK, C.XA_RBROLLBACK, M.ABORT),

    (S.IDLE, E.START): Step(S.IDLE, C.XAER_DUPID),
    (S.IDLE, E.START_JOIN): Step(S.ACTIVE, C.XA_OK),
    (S.IDLE, E.PREPARE): Step(S.PREPARED, C.XA_OK, M.PREPARE),
    (S.IDLE, E.PREPARE_READ_ONLY): Step(S.NONEXISTENT, C.XA_RDONLY),
    (S.IDLE, E.COMMIT_ONE_PHASE): Step(S.COMMITTED, C.XA_OK, M.COMMIT),
    (S.IDLE, E.ROLLBACK): Step(S.ROLLED_BACK, C.XA_OK, M.ABORT),
    (S.IDLE, E.TIMEOUT): Step(S.ROLLED_BACK, C.XA_RBTIMEOUT, M.ABORT),
    (S.IDLE, E.FAILOVER): Step(S.ROLLED_BACK, C.XA_RBROLLBACK, M.ABORT),

    (S.ROLLBACK_ONLY, E.START): Step(S.ROLLBACK_ONLY, C.XAER_DUPID),
    (S.ROLLBACK_ONLY, E.START_JOIN): Step(S.ROLLBACK_ONLY, C.XA_RBROLLBACK),
    (S.ROLLBACK_ONLY, E.SEND): Step(S.ROLLBACK_ONLY, C.XA_RBROLLBACK),
    (S.ROLLBACK_ONLY, E.PREPARE): Step(S.ROLLED_BACK, C.XA_RBROLLBACK, M.ABORT),
    (S.ROLLBACK_ONLY, E.PREPARE_READ_ONLY): Step(S.ROLLED_BACK, C.XA_RBROLLBACK, M.ABORT),
    (S.ROLLBACK_ONLY, E.COMMIT_ONE_PHASE): Step(S.ROLLED_BACK, C.XA_RBROLLBACK, M.ABORT),
    (S.ROLLBACK_ONLY, E.ROLLBACK): Step(S.ROLLED_BACK, C.XA_OK, M.ABORT),
    (S.ROLLBACK_ONLY, E.TIMEOUT): Step(S.ROLLED_BACK, C.XA_RBTIMEOUT, M.ABORT),
    (S.ROLLBACK_ONLY, E.FAILOVER): Step(S.ROLLED_BACK, C.XA_RBROLLBACK, M.ABORT),

    (S.PREPARED, E.START): Step(S.PREPARED, C.XAER_DUPID),
    (S.PREPARED, E.COMMIT): Step(S.COMMITTED, C.XA_OK, M.COMMIT),
    (S.PREPARED, E.ROLLBACK): Step(S.ROLLED_BACK, C.XA_OK, M.ABORT),
    (S.PREPARED, E.TIMEOUT): Step(S.HEURISTIC_ROLLED_BACK, C.XA_HEURRB, M.ABORT),
    (S.PREPARED, E.FAILOVER): Step(S.PREPARED, C.XA_OK),

    (S.COMMITTED, E.START): Step(S.ACTIVE, C.XA_OK),
    (S.COMMITTED, E.COMMIT): Step(S.COMMITTED, C.XA_OK),
    (S.COMMITTED, E.COMMIT_ONE_PHASE): Step(S.COMMITTED, C.XA_OK),
    (S.COMMITTED, E.TIMEOUT): Step(S.COMMITTED, C.XA_OK),
    (S.COMMITTED, E.FAILOVER): Step(S.COMMITTED, C.XA_OK),
    (S.COMMITTED, E.FORGET): Step(S.COMMITTED, C.XAER_NOTA),

    (S.ROLLED_BACK, E.START): Step(S.ACTIVE, C.XA_OK),
    (S.ROLLED_BACK, E.ROLLBACK): Step(S.ROLLED_BACK, C.XA_OK),
    (S.ROLLED_BACK, E.TIMEOUT): Step(S.ROLLED_BACK, C.XA_OK),
    (S.ROLLED_BACK, E.FAILOVER): Step(S.ROLLED_BACK, C.XA_OK),
    (S.ROLLED_BACK, E.FORGET): Step(S.ROLLED_BACK, C.XAER_NOTA),

    (S.HEURISTIC_ROLLED_BACK, E.START): Step(S.HEURISTIC_ROLLED_BACK, C.XAER_DUPID),
    (S.HEURISTIC_ROLLED_BACK, E.COMMIT): Step(S.HEURISTIC_ROLLED_BACK, C.XA_HEURRB),
    (S.HEURISTIC_ROLLED_BACK, E.ROLLBACK): Step(S.HEURISTIC_ROLLED_BACK, C.XA_HEURRB),
    (S.HEURISTIC_ROLLED_BACK, E.TIMEOUT): Step(S.HEURISTIC_ROLLED_BACK, C.XA_OK),
    (S.HEURISTIC_ROLLED_BACK, E.FAILOVER): Step(S.HEURISTIC_ROLLED_BACK, C.XA_OK),
    (S.HEURISTIC_ROLLED_BACK, E.FORGET): Step(S.NONEXISTENT, C.XA_OK),
})
for _event in (E.START_JOIN, E.SEND, E.END, E.END_FAIL, E.PREPARE, E.PREPARE_READ_ONLY, E.COMMIT_ONE_PHASE, E.COMMIT):
    TRANSITIONS[(S.ROLLED_BACK, _event)] = Step(S.ROLLED_BACK, C.XA_RBROLLBACK)

#: States in which a branch still holds records nobody may read yet.
IN_FLIGHT = frozenset({S.ACTIVE, S.IDLE, S.ROLLBACK_ONLY, S.PREPARED})
#: States ``xa_recover`` reports.
IN_DOUBT = frozenset({S.PREPARED, S.HEURISTIC_ROLLED_BACK})


def step(state: State, event: Event) -> Step:
    """The row for ``(state, event)``; a missing row is a protocol error that keeps the state."""
    return TRANSITIONS.get((state, event), Step(state, Code.XAER_PROTO))
