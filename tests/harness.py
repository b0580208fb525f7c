"""Real processes for integration and chaos tests: a thin re-export of ``metaq.tools.launcher``.

The launcher lives in the package (``metaq demo`` and the benchmarks use it too); the
pytest-specific parts (broker logs attached to failed reports) live in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from kazoo.client import KazooClient

from metaq.tools.launcher import (  # noqa: F401  (re-exported for the tests)
    DEFAULT_SESSION_TIMEOUT_MS,
    BrokerFactory,
    BrokerProcess,
    LocalCluster,
    port_accepts,
    wait_until,
    zk_session,
)
from metaq.zk.embedded import free_port  # noqa: F401
from metaq.zk.tls import make_kazoo_client

REPO_ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def kazoo_client(connect_string: str, **kwargs: Any) -> Iterator[KazooClient]:
    """A started kazoo client for a test to look at (or, with auth_data, write to) ZooKeeper."""
    client = make_kazoo_client(connect_string, timeout=10, **kwargs)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@contextlib.contextmanager
def metaq_zk_command(*args: str, **popen: Any) -> Iterator["subprocess.Popen[str]"]:
    """``metaq zk ARGS`` as a child process with its output piped; leaving the block asks it to
    stop (SIGTERM) and requires a clean exit, and a failure inside the block kills it."""
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "metaq", "zk", *args], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        yield process
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
