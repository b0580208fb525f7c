"""A ``metaq http`` gateway as a real OS process (for tests and the HTTP benchmark)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ..process import ChildProcess
from ..zk.embedded import free_port

#: The directory holding the ``metaq`` package: first on the child's PYTHONPATH, so the
#: child runs this very code (a worktree, say) and not some installed copy.
PACKAGE_PARENT = Path(__file__).resolve().parent.parent.parent


class GatewayProcess(ChildProcess):
    def __init__(self, zk_connect: str, zk_root: str, log_path: Path, port: int | None = None, *extra_args: str) -> None:
        self.zk_connect = zk_connect
        self.zk_root = zk_root
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.extra_args = list(extra_args)

    @property
    def url(self) -> str:
        scheme = "https" if "--tls-cert" in self.extra_args else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "metaq", "http", "--zk", self.zk_connect, "--zk-root", self.zk_root,
                "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args]

    def start(self, timeout: float = 30.0) -> "GatewayProcess":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
        self._log_handle = open(self.log_path, "ab")
        self._process = subprocess.Popen(self.command(), env=env, stdin=subprocess.DEVNULL,
                                         stdout=self._log_handle, stderr=subprocess.STDOUT)
        # Ready once it printed its URL: the port is open and ZooKeeper connected.
        deadline = time.monotonic() + timeout
        while "metaq http: serving" not in self.log_path.read_text(errors="replace"):
            if not self.alive or time.monotonic() > deadline:
                log = self.log_path.read_text(errors="replace")
                self.stop()
                raise RuntimeError(f"metaq http did not start: {log[-2000:]}")
            time.sleep(0.05)
        return self
