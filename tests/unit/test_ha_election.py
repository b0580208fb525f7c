"""The election rules (ha/election.py): who may try to take the master lock."""

from __future__ import annotations

from metaq.ha.election import Handover, eligibility, was_last_leader
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


from metaq.ha.election import BETTER_CANDIDATE_WAIT_S, CANDIDATE_WAIT_S, Candidate, candidate_turn  # noqa: E402


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
    # the best of a tie did not win within its turn: the second may try (it loses nothing)
    cands = _cands(s1=700, s2=700)
    assert not candidate_turn(2, 3, cands, {1, 2}, 0.5)[0]
    assert candidate_turn(2, 3, cands, {1, 2}, CANDIDATE_WAIT_S)[0]


def test_a_candidate_waits_out_a_live_candidate_holding_more_within_a_bound():
    """A freshly replaced, empty slave (slave0) and a slave holding 217,702 bytes (slave2) are
    orphaned together; slave1 (the old master, re-registering) never posts. On a loaded
    machine slave2 had not taken over after slave0's rank turn (1 s): slave0 used to go,
    won, and every partition lost what slave2 and the old master held. It must wait while
    slave2's candidacy stands (ephemeral: gone with slave2's session), but not for good: a
    live candidate that never elects itself is waited out after BETTER_CANDIDATE_WAIT_S."""
    cands = {0: Candidate(0, 0, 2, True), 2: Candidate(2, 217702, 2, True)}
    for waited in (CANDIDATE_WAIT_S, 2.75, BETTER_CANDIDATE_WAIT_S - 0.1):
        ok, why, retry = candidate_turn(0, 2, cands, {0, 1, 2}, waited)
        assert not ok and "slave2 is more caught up" in why and retry == CANDIDATE_WAIT_S, why
    assert candidate_turn(0, 2, cands, {0, 1, 2}, BETTER_CANDIDATE_WAIT_S)[0], "bounded: a group never stays masterless"
    assert candidate_turn(2, 2, cands, {0, 1, 2}, 2.75)[0]
    # slave2's session ended (died, or hung past its session timeout): its candidacy is gone
    assert candidate_turn(0, 2, {0: cands[0]}, {0, 1}, 2.75)[0]
    # a third candidate tied with slave0, ranked behind slave2 too, waits twice as long
    cands[3] = Candidate(3, 0, 2, True)
    assert not candidate_turn(3, 2, cands, {0, 2, 3}, 2 * BETTER_CANDIDATE_WAIT_S - 0.1)[0]


def test_ineligible_and_stale_candidacies_do_not_rank():
    cands = {1: Candidate(1, 500, 3, True), 2: Candidate(2, 900, 3, False), 4: Candidate(4, 999, 2, True)}
    assert candidate_turn(1, 3, cands, {1, 2}, 0.0)[0]  # slave2 not eligible, slave4 posted in an old round


# --- ZooKeeper lost its data ---------------------------------------------------

from metaq.ha.election import RESEED_WAIT_S, ReseedClaim, reseed_turn  # noqa: E402
from metaq.ha.epochs import read_led_epoch, record_led_epoch  # noqa: E402

EMPTY_ZK = dict(master_url=None, epoch=0, epoch_version=-1, leader_url=None, sync_set=None, sync_set_epoch=None, leader_identity=None)


def test_a_history_past_zookeepers_epoch_is_a_data_loss_only_its_last_leader_reseeds():
    # Before: a broker started without --slave founded epoch 1 over a history reaching epoch 2.
    for mode in ("async", "sync"):
        ok, why = _eligible(_state(**EMPTY_ZK), mode=mode, history=2, led_history=True)
        assert ok and "ZooKeeper lost the group's state" in why and "led epoch 2" in why
        ok, why = _eligible(_state(**EMPTY_ZK), mode=mode, my_slave_id=0, prefers_master=True, history=2, led_history=False)
        assert not ok and "waiting for the broker that led epoch 2" in why
    # A group ZooKeeper knows up to our history: the usual rules (here: founding a new group).
    assert _eligible(_state(**EMPTY_ZK), history=0)[1] == "the group has no epoch yet; founding it"
    # An operator's unclean hand-over still names who goes (metaq promote --unclean).
    handover = Handover(slave_id=0, epoch=0, unclean=True)
    assert _eligible(_state(**EMPTY_ZK), my_slave_id=0, history=2, handover=handover)[0]


def _claim(identity: str, history: int, led: bool = False) -> ReseedClaim:
    return ReseedClaim(identity, f"meta://{identity}:1", history, led, 100)


def test_reseed_waits_for_claims_and_yields_to_any_newer_history():
    me = _claim("b", 2, led=True)
    ok, why, retry = reseed_turn(me, [me, _claim("a", 2)], 0.5)
    assert not ok and "waiting for the other members' claims" in why and retry == RESEED_WAIT_S - 0.5
    ok, why, _ = reseed_turn(me, [me, _claim("a", 2)], RESEED_WAIT_S)
    assert ok and "meta://a:1: epoch 2" in why
    # A slave that followed a newer master holds the stale leader back, however long it waited.
    stale = _claim("a", 1, led=True)
    ok, why, _ = reseed_turn(stale, [stale, _claim("c", 2)], 60)
    assert not ok and "meta://c:1 knows a newer epoch" in why
    # Two claims that led the same epoch: exactly one goes.
    x, y = _claim("x", 4, led=True), _claim("y", 4, led=True)
    assert reseed_turn(x, [x, y], 60)[0] and not reseed_turn(y, [x, y], 60)[0]


def test_led_epoch_is_kept_durably_and_unreadable_claims_nothing(tmp_path):
    assert read_led_epoch(str(tmp_path)) == 0
    record_led_epoch(str(tmp_path / "data"), 7)
    assert read_led_epoch(str(tmp_path / "data")) == 7
    (tmp_path / "data" / "led-epoch").write_text("garbage")
    assert read_led_epoch(str(tmp_path / "data")) == 0


# --- async: only a replica that was in sync once is elected ---------------------------------

def test_an_async_slave_that_never_caught_up_since_it_started_is_not_eligible():
    """Seed 8008: a slave whose data dir was replaced restarted empty, followed the master of
    epoch 2 for 1 s and was orphaned holding nothing of 217,702 bytes; it was eligible (it
    followed the current master, nothing stopped) and won. Not any more: only without an
    operator's `metaq promote --unclean`, which still elects it."""
    state = _state(epoch=2, leader_identity="id-b")
    behind = ("chaos-0-0", "chaos-0-1", "txn-b-0-0", "txn-b-0-1", "txn-b-0-2")
    ok, why = _eligible(state, my_identity="id-a2", my_slave_id=0, followed_epoch=2, never_caught_up=behind)
    assert not ok and "not caught up" in why and "chaos-0-0" in why and "2 more" in why, why
    assert _eligible(state, my_identity="id-a2", my_slave_id=0, followed_epoch=2)[0]
    # the last leader and an operator's unclean hand-over are not held back by it
    assert _eligible(state, my_identity="id-b", followed_epoch=2, never_caught_up=behind)[0]
    ok, why = _eligible(state, my_identity="id-a2", my_slave_id=0, followed_epoch=2, never_caught_up=behind,
                        handover=Handover(0, 2, unclean=True))
    assert ok and "UNCLEAN" in why


def test_never_caught_up_names_replicas_behind_that_never_reached_the_master_end():
    from types import SimpleNamespace

    from metaq.ha.follower import MasterFollower
    from metaq.ha.replica import ReplicaStatus

    def replica(name: str, log_end: int, master_end: int, caught_up_at: float, state: str = "following"):
        status = ReplicaStatus(state=state, master_log_end=master_end, caught_up_at=caught_up_at)
        return SimpleNamespace(name=name, status=status, stopped=state == "stopped", log=SimpleNamespace(log_end=log_end))

    replicas = {
        ("fresh", 0): replica("fresh-0", 0, 59123, 0.0),  # replaced, empty: never caught up
        ("lagging", 0): replica("lagging-0", 100, 900, 1.5),  # behind now, in sync once: the lag window
        ("quiet", 0): replica("quiet-0", 0, 0, 0.0),  # nothing to catch up with
        ("stopped", 0): replica("stopped-0", 0, 50, 0.0, state="stopped"),  # the stopped rule's business
    }
    fake = SimpleNamespace(replicas=replicas, heartbeat=SimpleNamespace(master=SimpleNamespace(log_ends={("quiet", 0): 10})))
    fake._master_end = lambda t, p, r: MasterFollower._master_end(fake, t, p, r)
    assert MasterFollower.never_caught_up(fake) == ["fresh-0", "quiet-0"]
