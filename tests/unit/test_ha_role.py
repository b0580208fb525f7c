"""The HA role table (metaq/ha/role.py), transition by transition.

The expected table is written out here independently of the module: every
(state, event) pair is checked, the listed rows and the ignored ones.
"""

from __future__ import annotations

import itertools

import pytest

from metaq.ha.role import (
    ACTING_MASTER,
    HOLDS_LOCK,
    Event,
    Role,
    RoleMachine,
    Step,
    catch_up_event,
    entry_failed_event,
    handover_event,
    master_event,
    reconnected_event,
)

S, E = Role, Event
LOOK = "look"  # stay and read ZooKeeper again

# One line per state, in the column order below; "." = ignored; RESUME = move without the entry action.
COLUMNS = [
    E.MASTER_SEEN, E.MASTER_CHANGED, E.MASTER_GONE, E.ELIGIBLE, E.WON, E.LOST, E.SUSPENDED,
    E.RECONNECTED_SAME_EPOCH, E.RECONNECTED_EPOCH_LOST, E.SESSION_LOST, E.HIGHER_EPOCH,
    E.STALE_MASTER, E.REEVALUATE, E.STOP, E.HANDOVER_ASKED, E.CAUGHT_UP, E.ABANDONED, E.CANNOT_LEAD,
]
_ = "."
RESUME = "resume"
EXPECTED = {
    S.STARTING: [_, S.FOLLOWING, S.ORPHANED, _, _, _, _, _, _, _, _, _, LOOK, S.STOPPED, LOOK, _, _, _],
    S.FOLLOWING: [_, S.FOLLOWING, S.ORPHANED, _, _, _, _, _, _, _, _, LOOK, LOOK, S.STOPPED, LOOK, _, _, _],
    S.ORPHANED: [_, S.FOLLOWING, S.ORPHANED, S.ELECTING, _, _, _, _, _, _, _, _, LOOK, S.STOPPED, LOOK, _, _, _],
    S.ELECTING: [_, S.FOLLOWING, _, _, S.LEADING, S.ORPHANED, _, _, S.ORPHANED, S.ORPHANED, _, _, LOOK, S.STOPPED, LOOK, _, _, _],
    S.LEADING: [_, _, S.FENCED, _, _, _, S.FENCED, _, S.FENCED, S.FENCED, S.FENCED, _, LOOK, S.STOPPED,
                S.HANDING_OVER, _, _, S.RESIGNED],
    S.HANDING_OVER: [_, _, S.FENCED, _, _, _, S.FENCED, _, S.FENCED, S.FENCED, S.FENCED, _, LOOK, S.STOPPED,
                     _, S.RESIGNED, RESUME, _],
    S.RESIGNED: [_, S.FOLLOWING, S.ORPHANED, _, _, _, _, _, S.ORPHANED, S.ORPHANED, _, _, LOOK, S.STOPPED, LOOK, _, _, _],
    S.FENCED: [_, S.FOLLOWING, S.ORPHANED, _, _, _, _, S.LEADING, S.ORPHANED, S.ORPHANED, _, _, LOOK, S.STOPPED, LOOK, _, _,
               S.RESIGNED],
    S.STOPPED: [_] * 18,
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
    elif expected == RESUME:
        assert step == Step(S.LEADING, enter=False), "an abandoned hand-over resumes the term it paused"
        assert machine.state is S.LEADING
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


def test_a_hand_over_is_a_path_through_the_table() -> None:
    machine = RoleMachine()
    machine.state = S.LEADING
    for event, state in [
        (E.HANDOVER_ASKED, S.HANDING_OVER),
        (E.HANDOVER_ASKED, S.HANDING_OVER),  # the same request again: nothing new
        (E.ABANDONED, S.LEADING),  # too slow: writes resume
        (E.HANDOVER_ASKED, S.HANDING_OVER),
        (E.CAUGHT_UP, S.RESIGNED),  # the lock is given back
        (E.MASTER_CHANGED, S.FOLLOWING),  # the target won: follow it
    ]:
        machine.handle(event)
        assert machine.state is state, event
        assert not machine.may_ack_writes or state is S.LEADING


def test_only_the_lock_holder_registers_as_master_and_every_state_of_the_term_acts_as_master() -> None:
    assert HOLDS_LOCK == {S.LEADING, S.HANDING_OVER}
    assert ACTING_MASTER == {S.LEADING, S.HANDING_OVER, S.FENCED, S.RESIGNED}


def test_handover_event_asks_only_the_master_of_the_named_epoch_for_a_clean_hand_over() -> None:
    assert handover_event(4, False, 4) is E.HANDOVER_ASKED
    assert handover_event(3, False, 4) is E.REEVALUATE, "a request for an earlier master"
    assert handover_event(4, True, 4) is E.REEVALUATE, "unclean is for a group without a master"


def test_catch_up_event_waits_for_the_target_then_gives_up() -> None:
    assert catch_up_event(S.HANDING_OVER, target_behind=True, waited_s=1.0, timeout_s=5.0) is None
    assert catch_up_event(S.HANDING_OVER, target_behind=False, waited_s=9.0, timeout_s=5.0) is E.CAUGHT_UP
    assert catch_up_event(S.HANDING_OVER, target_behind=True, waited_s=5.1, timeout_s=5.0) is E.ABANDONED
    assert catch_up_event(S.FENCED, target_behind=False, waited_s=0.0, timeout_s=5.0) is E.ABANDONED, "left the state"


def test_entry_failed_event_tells_a_zookeeper_blip_from_a_broker_that_cannot_lead() -> None:
    assert entry_failed_event(S.LEADING, zookeeper_error=True) is E.SUSPENDED
    assert entry_failed_event(S.LEADING, zookeeper_error=False) is E.CANNOT_LEAD
    assert entry_failed_event(S.FOLLOWING, zookeeper_error=False) is None
