"""The HA role table (metaq/ha/role.py), transition by transition.

The expected table is written out here independently of the module: every
(state, event) pair is checked, the listed rows and the ignored ones.
"""

from __future__ import annotations

import itertools

import pytest

from metaq.ha.role import Event, Role, RoleMachine, Step, master_event, reconnected_event

S, E = Role, Event
LOOK = "look"  # stay and read ZooKeeper again

# One line per state, in the column order below; "." = ignored.
COLUMNS = [
    E.MASTER_SEEN, E.MASTER_CHANGED, E.MASTER_GONE, E.ELIGIBLE, E.WON, E.LOST, E.SUSPENDED,
    E.RECONNECTED_SAME_EPOCH, E.RECONNECTED_EPOCH_LOST, E.SESSION_LOST, E.HIGHER_EPOCH,
    E.STALE_MASTER, E.REEVALUATE, E.STOP,
]
_ = "."
EXPECTED = {
    S.STARTING: [_, S.FOLLOWING, S.ORPHANED, _, _, _, _, _, _, _, _, _, LOOK, S.STOPPED],
    S.FOLLOWING: [_, S.FOLLOWING, S.ORPHANED, _, _, _, _, _, _, _, _, LOOK, LOOK, S.STOPPED],
    S.ORPHANED: [_, S.FOLLOWING, S.ORPHANED, S.ELECTING, _, _, _, _, _, _, _, _, LOOK, S.STOPPED],
    S.ELECTING: [_, S.FOLLOWING, _, _, S.LEADING, S.ORPHANED, _, _, S.ORPHANED, S.ORPHANED, _, _, LOOK, S.STOPPED],
    S.LEADING: [_, _, S.FENCED, _, _, _, S.FENCED, _, S.FENCED, S.FENCED, S.FENCED, _, LOOK, S.STOPPED],
    S.FENCED: [_, S.FOLLOWING, S.ORPHANED, _, _, _, _, S.LEADING, S.ORPHANED, S.ORPHANED, _, _, LOOK, S.STOPPED],
    S.STOPPED: [_] * 14,
}


def test_the_expected_table_covers_every_state_and_event() -> None:
    assert set(EXPECTED) == set(Role) and set(COLUMNS) == set(Event)
    assert all(len(row) == len(COLUMNS) for row in EXPECTED.values())


@pytest.mark.parametrize(("state", "event"), list(itertools.product(Role, Event)), ids=lambda x: x.name)
def test_every_state_and_event(state: Role, event: Event) -> None:
    expected = EXPECTED[state][COLUMNS.index(event)]
    machine = RoleMachine()
    machine.state = state
    step = machine.handle(event)
    if expected == _:
        assert step is None, f"{state.name} + {event.name} must be ignored"
        assert machine.state is state
    elif expected == LOOK:
        assert step == Step(state, look_again=True)
        assert machine.state is state
    else:
        assert step == Step(expected, look_again=False)
        assert machine.state is expected


def test_only_leading_may_ack() -> None:
    machine = RoleMachine()
    for state in Role:
        machine.state = state
        assert machine.may_ack_writes is (state is Role.LEADING)


def test_a_failover_path_through_the_table() -> None:
    machine = RoleMachine()
    path = [
        (E.MASTER_CHANGED, S.FOLLOWING),  # a master exists: follow it
        (E.MASTER_SEEN, S.FOLLOWING),  # the same master again: nothing to do
        (E.MASTER_GONE, S.ORPHANED),
        (E.ELIGIBLE, S.ELECTING),
        (E.WON, S.LEADING),
        (E.SUSPENDED, S.FENCED),
        (E.RECONNECTED_SAME_EPOCH, S.LEADING),
        (E.HIGHER_EPOCH, S.FENCED),
        (E.MASTER_CHANGED, S.FOLLOWING),
        (E.STOP, S.STOPPED),
    ]
    for event, state in path:
        machine.handle(event)
        assert machine.state is state, event


def test_master_event_tells_the_followed_master_from_a_new_one() -> None:
    assert master_event("b:2", "b:2") is E.MASTER_SEEN
    assert master_event("c:3", "b:2") is E.MASTER_CHANGED
    assert master_event("b:2", None) is E.MASTER_CHANGED


def test_reconnected_event_needs_our_epoch_and_our_lock() -> None:
    assert reconnected_event(4, "me:1", 4, "me:1") is E.RECONNECTED_SAME_EPOCH
    assert reconnected_event(5, "other:2", 4, "me:1") is E.RECONNECTED_EPOCH_LOST
    assert reconnected_event(4, None, 4, "me:1") is E.RECONNECTED_EPOCH_LOST
    assert reconnected_event(5, "me:1", 4, "me:1") is E.RECONNECTED_EPOCH_LOST
