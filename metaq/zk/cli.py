"""`metaq zk`: an embedded standalone ZooKeeper in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

import re
import signal
import socket
import sys
import threading
from types import FrameType

from metaq.zk.embedded import EmbeddedZooKeeper, ZooKeeperError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def run_zk(port: int, data_dir: str | None, tick_ms: int, *, super_digest: str | None = None,
           host: str = "127.0.0.1") -> int:
    """Serve until a signal arrives; returns the process exit code (0 clean, 1 failure)."""
    if super_digest is not None and not re.fullmatch(r"super:[A-Za-z0-9+/]{27}=", super_digest):
        print("metaq zk: --super-digest must look like super:HASH (see 'metaq security zk-super-digest')", file=sys.stderr)
        return EXIT_USAGE
    try:
        socket.getaddrinfo(host, port or None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OverflowError) as exc:
        print(f"metaq zk: --host {host!r} is not an address of this machine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        server = EmbeddedZooKeeper(port=port, data_dir=data_dir, tick_ms=tick_ms, super_digest=super_digest, host=host)
    except OSError as exc:  # port 0 picks a free port on host: it must be an address of this machine
        print(f"metaq zk: cannot listen on {host}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start()
        except ZooKeeperError as exc:
            # The first line is the reason; the rest is the server's log tail.
            print(f"metaq zk: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(
            f"ZooKeeper serving on {server.connect_string} (pid {server.pid}, log {server.log_path})",
            flush=True,
        )
        # Wake up regularly to notice a JVM that died on its own.
        while not stop_requested.wait(0.5):
            if not server.alive:
                # The log may live in a temporary dir that stop() removes: show its tail now.
                print(
                    f"metaq zk: ZooKeeper (pid {server.pid}) exited unexpectedly; log tail:\n"
                    f"{server.log_text(last_lines=20)}",
                    file=sys.stderr,
                )
                return EXIT_FAILED
        return EXIT_OK
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
