"""The election rules (ha/election.py): who may try to take the master lock."""

from __future__ import annotations

from metaq.ha.election import eligibility, was_last_leader
from metaq.zk.group import GroupState
from metaq.zk.paths import decode_epoch, decode_epoch_identity, encode_epoch


def _state(**kw) -> GroupState:
    base = dict(master_url=None, epoch=3, epoch_version=2, leader_url="meta://h:1", sync_set=frozenset(), sync_set_epoch=3, leader_identity="id-a")
    base.update(kw)
    return GroupState(**base)


def _eligible(state: GroupState, **kw) -> tuple[bool, str]:
    args = dict(mode="async", auto_failover=True, my_url="meta://h:2", my_identity="id-a", my_slave_id=None,
                prefers_master=True, followed_epoch=0, replicas_healthy=True, state=state)
    args.update(kw)
    return eligibility(**args)


def test_last_leader_is_known_by_identity_not_url():
    state = _state()
    assert was_last_leader(state, "meta://h:2", "id-a")  # restarted on another port
    assert not was_last_leader(state, "meta://h:1", "id-wiped")  # same address, data dir wiped
    assert was_last_leader(_state(leader_identity=None), "meta://h:1", "id-x")  # epoch of an older version


def test_restarted_master_on_a_new_port_may_take_over_in_both_modes():
    for mode in ("async", "sync"):
        ok, why = _eligible(_state(), mode=mode)
        assert ok and "master of epoch 3" in why


def test_a_broker_that_failed_to_lead_does_not_try_again():
    ok, why = _eligible(_state(), cannot_lead="OSError: no space")
    assert not ok and "failed to take up leading" in why and "restart" in why


def test_epoch_value_keeps_the_identity_and_old_values_still_decode():
    data = encode_epoch(5, "meta://h:1", "id-a")
    assert decode_epoch(data) == (5, "meta://h:1")
    assert decode_epoch_identity(data) == "id-a"
    assert decode_epoch_identity(encode_epoch(5, "meta://h:1")) is None
    assert decode_epoch_identity(b"7") is None


from metaq.ha.election import CANDIDATE_WAIT_S, Candidate, candidate_turn  # noqa: E402


def _cands(**ends: int) -> dict[int, Candidate]:
    return {int(k[1:]): Candidate(int(k[1:]), end, 3, True) for k, end in ends.items()}


def test_most_caught_up_candidate_goes_first_ties_to_lowest_slave_id():
    cands = _cands(s1=500, s2=900)
    assert candidate_turn(2, 3, cands, {1, 2}, 0.0)[0]
    ok, why, retry = candidate_turn(1, 3, cands, {1, 2}, 0.0)
    assert not ok and "slave2 is more caught up" in why and retry == CANDIDATE_WAIT_S
    tie = _cands(s1=700, s2=700)
    assert candidate_turn(1, 3, tie, {1, 2}, 0.0)[0] and not candidate_turn(2, 3, tie, {1, 2}, 0.0)[0]


def test_a_silent_live_slave_is_waited_for_then_the_next_best_may_try():
    cands = _cands(s1=500)
    ok, why, retry = candidate_turn(1, 3, cands, {1, 2}, 0.2)
    assert not ok and "[2]" in why and abs(retry - (CANDIDATE_WAIT_S - 0.2)) < 1e-9
    assert candidate_turn(1, 3, cands, {1, 2}, CANDIDATE_WAIT_S)[0]
    # the best did not win within its turn: the second may try
    cands = _cands(s1=500, s2=900)
    assert candidate_turn(1, 3, cands, {1, 2}, CANDIDATE_WAIT_S)[0]


def test_ineligible_and_stale_candidacies_do_not_rank():
    cands = {1: Candidate(1, 500, 3, True), 2: Candidate(2, 900, 3, False), 4: Candidate(4, 999, 2, True)}
    assert candidate_turn(1, 3, cands, {1, 2}, 0.0)[0]  # slave2 not eligible, slave4 posted in an old round
