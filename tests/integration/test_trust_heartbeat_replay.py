"""Signed UDP heartbeats cannot be replayed, nor used as a reflector.

A secured master and slave (real processes). The slave is paused (SIGSTOP), so its own
heartbeats stop and the master's ``heartbeat_age_ms`` for it grows. A heartbeat signed an
hour ago (what an eavesdropper records: the MAC stays valid forever) is replayed 50 times:
the master must neither count it (the silent slave must keep looking silent) nor answer it.
Fresh signed heartbeats are answered only at the slave's registered host, and never with
more bytes than they carry.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from metaq.ha.heartbeat import encode_signed
from metaq.security.group import GroupSecret
from metaq.tools.launcher import wait_until

from .trust_support import SecuredGroup, put_as, stats

TOPIC = "t"


def heartbeat_age_ms(master) -> float:  # type: ignore[no-untyped-def]
    row = stats(master, "ops").row(f"slave0 {TOPIC}-0-0")
    return -1 if row is None else row["heartbeat_age_ms"]


def answer(sock: socket.socket, datagram: bytes, address: tuple[str, int]) -> bytes | None:
    """What the master sends back to ``sock`` for ``datagram`` within a second, or None."""
    sock.sendto(datagram, address)
    sock.settimeout(1.0)
    try:
        return sock.recvfrom(65536)[0]
    except socket.timeout:
        return None


def test_a_replayed_heartbeat_neither_revives_a_silent_slave_nor_is_answered(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    group = SecuredGroup(tmp_path / "security")
    master = broker_factory(0, {TOPIC: 1}, group.system)
    # A long ZooKeeper session: the paused slave stays registered (else it would be ignored as unknown).
    slave = broker_factory(0, {TOPIC: 1}, group.system, {"slaveId": 0}, zookeeper={"zk.zkSessionTimeoutMs": 30000})
    assert put_as(master, "app").code == 200
    wait_until(lambda: 0 <= heartbeat_age_ms(master) < 2000, 30, message="the slave's heartbeats reach the master")
    key = GroupSecret.load(group.secret_file, 0).heartbeat_key()
    heartbeat = {"kind": "hb", "role": "slave", "broker_id": 0, "slave_id": 0, "epoch": 1, "log_ends": {f"{TOPIC}/0": 1}}
    recorded = encode_signed({**heartbeat, "sent_at": time.time() - 3600}, key)
    os.kill(slave.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: heartbeat_age_ms(master) > 1500, 10, message="the paused slave falls silent")
        bad_before = stats(master, "ops").get("heartbeats_bad")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            for _ in range(49):
                udp.sendto(recorded, master.address)
            assert answer(udp, recorded, master.address) is None, "a replay is not answered"
        assert heartbeat_age_ms(master) > 1500, "50 replays did not make the silent slave look alive"
        assert stats(master, "ops").get("heartbeats_bad") - bad_before == 50

        fresh = encode_signed({**heartbeat, "sent_at": time.time()}, key)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as elsewhere:
            elsewhere.bind(("127.0.0.2", 0))
            assert answer(elsewhere, fresh, master.address) is None, "no answer away from the slave's registered host"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as at_home:
            at_home.bind(("127.0.0.1", 0))
            reply = answer(at_home, encode_signed({**heartbeat, "sent_at": time.time()}, key), master.address)
            request_size = len(encode_signed({**heartbeat, "sent_at": time.time()}, key))
        assert reply is not None and len(reply) <= request_size, "answered at home, never bigger than the heartbeat"
    finally:
        os.kill(slave.pid, signal.SIGCONT)
    wait_until(lambda: 0 <= heartbeat_age_ms(master) < 2000, 30, message="the resumed slave's own heartbeats count again")
