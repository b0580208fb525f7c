"""The XA branch table (metaq/txn/xa.py), pair by pair.

The expected table is written out here independently of the module, as a grid:
every (state, event) pair is checked, including the protocol errors.
"""

from __future__ import annotations

import itertools

import pytest

from metaq.txn.xa import IN_DOUBT, IN_FLIGHT, TRANSITIONS, Code, Event, Marker, State, Step, step

S, E = State, Event
COLUMNS = [E.START, E.START_JOIN, E.SEND, E.END, E.END_FAIL, E.PREPARE, E.PREPARE_READ_ONLY,
           E.COMMIT_ONE_PHASE, E.COMMIT, E.ROLLBACK, E.TIMEOUT, E.FAILOVER, E.FORGET]
SHORT = {"NX": S.NONEXISTENT, "AC": S.ACTIVE, "ID": S.IDLE, "RO": S.ROLLBACK_ONLY, "PR": S.PREPARED,
         "CM": S.COMMITTED, "RB": S.ROLLED_BACK, "HR": S.HEURISTIC_ROLLED_BACK}
CODES = {"ok": Code.XA_OK, "rdonly": Code.XA_RDONLY, "rb": Code.XA_RBROLLBACK, "rbto": Code.XA_RBTIMEOUT,
         "heur": Code.XA_HEURRB, "proto": Code.XAER_PROTO, "nota": Code.XAER_NOTA, "dup": Code.XAER_DUPID}
MARKERS = {"P": Marker.PREPARE, "C": Marker.COMMIT, "A": Marker.ABORT}
# cell: "STATE/code[+marker]"; "." for the state = unchanged; "-" = protocol error, unchanged.
EXPECTED = {
    #        START     JOIN      SEND      END       END_FAIL  PREPARE      PREP_RO      COMMIT_1P    COMMIT    ROLLBACK     TIMEOUT        FAILOVER     FORGET
    "NX": ["AC/ok",   "./nota", "./nota", "./nota", "./nota", "./nota",    "./nota",    "./nota",    "./nota", "./nota",    "./ok",        "./ok",      "./nota"],
    "AC": ["./dup",   "-",      "./ok",   "ID/ok",  "RO/ok",  "-",         "-",         "-",         "-",      "-",         "RB/rbto+A",   "RB/rb+A",   "-"],
    "ID": ["./dup",   "AC/ok",  "-",      "-",      "-",      "PR/ok+P",   "NX/rdonly", "CM/ok+C",   "-",      "RB/ok+A",   "RB/rbto+A",   "RB/rb+A",   "-"],
    "RO": ["./dup",   "./rb",   "./rb",   "-",      "-",      "RB/rb+A",   "RB/rb+A",   "RB/rb+A",   "-",      "RB/ok+A",   "RB/rbto+A",   "RB/rb+A",   "-"],
    "PR": ["./dup",   "-",      "-",      "-",      "-",      "-",         "-",         "-",         "CM/ok+C", "RB/ok+A",  "HR/heur+A",   "./ok",      "-"],
    "CM": ["AC/ok",   "-",      "-",      "-",      "-",      "-",         "-",         "./ok",      "./ok",   "-",         "./ok",        "./ok",      "./nota"],
    "RB": ["AC/ok",   "./rb",   "./rb",   "./rb",   "./rb",   "./rb",      "./rb",      "./rb",      "./rb",   "./ok",      "./ok",        "./ok",      "./nota"],
    "HR": ["./dup",   "-",      "-",      "-",      "-",      "-",         "-",         "-",         "./heur", "./heur",    "./ok",        "./ok",      "NX/ok"],
}


def expected_step(state: State, cell: str) -> Step:
    if cell == "-":
        return Step(state, Code.XAER_PROTO)
    target, _, rest = cell.partition("/")
    code, _, marker = rest.partition("+")
    return Step(state if target == "." else SHORT[target], CODES[code], MARKERS[marker] if marker else None)


def test_the_expected_grid_covers_every_state_and_event() -> None:
    assert {SHORT[k] for k in EXPECTED} == set(State) and set(COLUMNS) == set(Event)
    assert all(len(row) == len(COLUMNS) for row in EXPECTED.values())


@pytest.mark.parametrize("short, event", list(itertools.product(EXPECTED, COLUMNS)))
def test_each_pair(short: str, event: Event) -> None:
    state = SHORT[short]
    assert step(state, event) == expected_step(state, EXPECTED[short][COLUMNS.index(event)])


def test_no_row_leaves_the_table_for_an_unknown_state_or_commits_without_a_commit_request() -> None:
    for (state, event), row in TRANSITIONS.items():
        assert isinstance(state, State) and isinstance(event, Event)
        if row.marker is Marker.COMMIT:
            assert event in (E.COMMIT, E.COMMIT_ONE_PHASE)


def test_every_unsuccessful_end_of_an_in_flight_branch_writes_an_abort() -> None:
    for state in IN_FLIGHT:
        for event in Event:
            row = step(state, event)
            if row.state in (S.ROLLED_BACK, S.HEURISTIC_ROLLED_BACK) and row.state is not state:
                assert row.marker is Marker.ABORT, (state, event)


def test_recover_reports_prepared_and_heuristic_branches() -> None:
    assert IN_DOUBT == {S.PREPARED, S.HEURISTIC_ROLLED_BACK}


def test_a_local_transaction_is_start_send_end_commit_one_phase() -> None:
    state, markers = S.NONEXISTENT, []
    for event in (E.START, E.SEND, E.SEND, E.END, E.COMMIT_ONE_PHASE):
        row = step(state, event)
        assert row.code is Code.XA_OK
        state = row.state
        markers.append(row.marker)
    assert state is S.COMMITTED and markers == [None] * 4 + [Marker.COMMIT]


def test_the_grid_in_the_modules_docstring_is_the_table() -> None:
    import metaq.txn.xa as xa

    rows = {line.split()[0]: line.split()[1:] for line in xa.__doc__.splitlines()
            if line.startswith("    ") and line.split() and line.split()[0] in SHORT}
    assert rows == EXPECTED
