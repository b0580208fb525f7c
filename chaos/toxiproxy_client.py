"""Where the fault proxy lives, and a ``toxiproxy-python`` client pointed at it.

Order of preference:

1. ``TOXIPROXY_URL`` is set: use that server (not started, not stopped by us);
2. a real ``toxiproxy-server`` is on PATH: start it on a free port, stop it by pid;
3. otherwise our own asyncio implementation (``chaos.proxy``) in a thread of this process.

That is ``mode="auto"`` (the default); ``mode="thread"`` and ``mode="process"`` always run
ours, in a thread or as ``python -m chaos proxy``.

``toxiproxy-python`` keeps the server address in class attributes of its
``APIConsumer`` (one server per process); ``client_for`` sets them, so call it before
using a client if several servers are in play.

    with fault_proxy() as fp:
        proxy = fp.client.create(upstream="127.0.0.1:9000", name="broker0")
        proxy.add_toxic(type="latency", attributes={"latency": 100})
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer

from chaos.proxy import ProxyThread
from metaq.tools.launcher import port_accepts, wait_until
from metaq.zk.embedded import free_port

PACKAGE_PARENT = Path(__file__).resolve().parent.parent


MODES = ("auto", "thread", "process")


def client_for(url: str) -> Toxiproxy:
    """A toxiproxy-python client for the server at ``url`` (``http://host:port``)."""
    parsed = urlparse(url if "//" in url else f"http://{url}")
    APIConsumer.host = parsed.hostname or "127.0.0.1"
    APIConsumer.port = parsed.port or 8474
    return Toxiproxy()


def _wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    def listening() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"fault proxy exited with code {proc.returncode} before listening")
        return port_accepts(host, port)

    try:
        wait_until(listening, timeout, message=f"fault proxy to listen on {host}:{port}")
    except AssertionError as exc:
        raise RuntimeError(str(exc)) from None


class FaultProxy:
    """A running Toxiproxy-API server (see the module doc for which one) and its client."""

    def __init__(
        self, mode: str = "auto", host: str = "127.0.0.1", seed: int | None = None, fallback: str = "thread"
    ) -> None:
        """``mode``: auto (TOXIPROXY_URL, else toxiproxy-server on PATH, else ``fallback``:
        our proxy in a thread or in a child process), thread or process."""
        # Checked here: an unknown mode (or fallback) used to fall through to a thread silently.
        if mode not in MODES or fallback not in MODES[1:]:
            raise ValueError(f"fault proxy mode must be one of {', '.join(MODES)} (fallback thread or process), "
                             f"got mode={mode!r}, fallback={fallback!r}")
        self.mode, self.host, self.seed, self.fallback = mode, host, seed, fallback
        self.url = ""
        self.kind = ""
        self._thread: ProxyThread | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> "FaultProxy":
        env_url = os.environ.get("TOXIPROXY_URL")
        real = shutil.which("toxiproxy-server")
        if self.mode == "auto" and env_url:
            self.url, self.kind = env_url, "external"
        elif self.mode == "auto" and real:
            port = free_port(self.host)
            self._proc = subprocess.Popen([real, "-host", self.host, "-port", str(port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _wait_port(self.host, port, 15, self._proc)
            self.url, self.kind = f"http://{self.host}:{port}", "toxiproxy-server"
        elif self.mode == "process" or (self.mode == "auto" and self.fallback == "process"):
            port = free_port(self.host)
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
            cmd = [sys.executable, "-m", "chaos", "proxy", "--host", self.host, "--port", str(port)]
            if self.seed is not None:
                cmd += ["--seed", str(self.seed)]
            self._proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _wait_port(self.host, port, 15, self._proc)
            self.url, self.kind = f"http://{self.host}:{port}", "chaos-process"
        else:
            self._thread = ProxyThread(self.host, 0, seed=self.seed).start()
            self.url, self.kind = self._thread.url, "chaos-thread"
        return self

    @property
    def client(self) -> Toxiproxy:
        return client_for(self.url)

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._proc is not None:
            if self._proc.poll() is None:
                os.kill(self._proc.pid, signal.SIGTERM)
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(self._proc.pid, signal.SIGKILL)
                    self._proc.wait(10)
            self._proc = None
        if self.kind == "external":
            # Not ours to stop; leave it clean for the next user.
            try:
                self.client.reset()
            except Exception:
                pass

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fault_proxy(mode: str = "auto", seed: int | None = None) -> FaultProxy:
    """``with fault_proxy() as fp: fp.client...``"""
    return FaultProxy(mode=mode, seed=seed)
