"""free_port: ports a broker can still bind when it starts later or restarts.

A port drawn from the kernel's ephemeral range can be taken by any outgoing connection
(a proxy's upstream, a ZooKeeper client) between the moment it is chosen and the moment
the broker binds it: a chaos cluster's last slave once died at start that way.
"""

from __future__ import annotations

import socket

from metaq.zk import embedded
from metaq.zk.embedded import free_port


def test_ports_come_from_outside_the_ephemeral_range_and_are_never_handed_out_twice():
    low, high = embedded._ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(not (low <= p <= high) for p in ports)
    assert all(p >= 1024 for p in ports)


def test_a_port_that_is_bound_is_not_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(embedded.random, "randint", lambda a, b: busy)
        # Every random pick is the bound port: the fallback (the kernel's pick) answers.
        port = free_port()
    assert port != busy


def test_with_no_room_outside_the_ephemeral_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(embedded, "_ephemeral_range", lambda: (1024, 65535))
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free indeed


def test_a_port_another_live_process_took_is_not_handed_out_until_that_process_is_gone(tmp_path, monkeypatch):
    """A test session and a chaos run beside it both start brokers: neither may pick a port the
    other picked and has not bound yet (or bound, and freed while its broker restarts)."""
    import subprocess
    import sys

    monkeypatch.setattr(embedded, "PORT_CLAIMS_DIR", tmp_path / "claims")
    script = ("import sys; from metaq.zk import embedded; from pathlib import Path; "
              f"embedded.PORT_CLAIMS_DIR = Path({str(tmp_path / 'claims')!r}); "
              "print(embedded.free_port(), flush=True); sys.stdin.read()")
    other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        taken = int(other.stdout.readline())
        picks = iter([taken, taken, taken])
        monkeypatch.setattr(embedded.random, "randint", lambda a, b: next(picks, a + 1))
        assert free_port() != taken  # free to bind, but the other process's
    finally:
        other.stdin.close()
        other.wait(10)
    embedded._handed_out.discard(taken)
    monkeypatch.setattr(embedded.random, "randint", lambda a, b: taken)
    assert free_port() == taken  # its process is gone: the claim is taken over
