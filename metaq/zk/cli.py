"""`metaq zk`: an embedded standalone ZooKeeper in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType

from metaq.zk.embedded import EmbeddedZooKeeper, ZooKeeperError
from metaq.zk.tls import ZkServerTls

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def default_data_dir(port: int) -> Path:
    """Where ``metaq zk`` keeps its data by default: one directory per port, kept across restarts.

    A ZooKeeper that forgets its data on restart takes every group's epoch, sync set and
    topic configuration with it (docs/operations.md, "Losing ZooKeeper's data"), so the
    default keeps them; ``--ephemeral`` is the throwaway choice.
    """
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "metaq" / f"zookeeper-{port}"


def run_zk(port: int, data_dir: str | None, tick_ms: int, *, super_digest: str | None = None, ephemeral: bool = False,
           host: str = "127.0.0.1", tls: ZkServerTls | None = None) -> int:
    """Serve until a signal arrives; returns the process exit code (0 clean, 1 failure, 2 usage).

    The data lives in ``data_dir``, else ``default_data_dir(port)``, both kept; with
    ``ephemeral`` in a temporary directory removed on exit.
    """
    # Checked here, not left to the JVM, whose refusal is a page of log with the reason inside.
    if not 0 <= port <= 65535:
        print(f"metaq zk: --port must be between 0 and 65535, got {port}", file=sys.stderr)
        return EXIT_USAGE
    if tick_ms < 1:
        print(f"metaq zk: --tick-ms must be >= 1, got {tick_ms}", file=sys.stderr)
        return EXIT_USAGE
    if super_digest is not None and not re.fullmatch(r"super:[A-Za-z0-9+/]{27}=", super_digest):
        print("metaq zk: --super-digest must look like super:HASH (see 'metaq security zk-super-digest')", file=sys.stderr)
        return EXIT_USAGE
    try:
        socket.getaddrinfo(host, port or None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OverflowError) as exc:
        print(f"metaq zk: --host {host!r} is not an address of this machine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if data_dir is None and not ephemeral:
        if port == 0:
            print("metaq zk: --port 0 picks another port each run, so it has no default data dir: give --data-dir, or --ephemeral",
                  file=sys.stderr)
            return EXIT_USAGE
        data_dir = str(default_data_dir(port))
    if data_dir is not None:
        # Made here, as start() would, so an unusable path is one line (stop() cleans up inside it too).
        try:
            Path(data_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"metaq zk: data dir {data_dir}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
    try:
        server = EmbeddedZooKeeper(port=port, data_dir=data_dir, tick_ms=tick_ms, super_digest=super_digest, host=host,
                                   tls=tls)
    except (OSError, ValueError) as exc:  # port 0 picks a free port on host: it must be an address of this machine
        print(f"metaq zk: cannot listen on {host}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    kept = "temporary, removed on exit (--ephemeral)" if ephemeral else "kept across restarts"
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
            f"ZooKeeper serving{' TLS only' if tls else ''} on {server.connect_string} (pid {server.pid}, data {server.data_dir}: {kept};"
            f" log {server.log_path})",
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
