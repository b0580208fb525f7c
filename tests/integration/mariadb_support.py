"""A real MariaDB server for a test: Debian's mariadbd on a free loopback port, its own datadir.

Started with ``--no-defaults`` so no system config (or system server) is involved, and
stopped by its pid. scripts/setup.sh --test installs the ``mariadb-server`` package;
without it the tests using this fail (not skip) with a line saying so, because CI must
run them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pymysql
import pytest

from metaq.zk.embedded import free_port

USER, PASSWORD, DATABASE = "metaq", "metaq-test", "metaq"


def _binary(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)
    if path is None:
        pytest.fail(f"MariaDB is not installed ({name} not found): run 'bash scripts/setup.sh --test' "
                    "(it installs Debian's mariadb-server)", pytrace=False)
    return path


class MariaDB:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.datadir = base / "data"
        # A unix socket path is limited to ~100 bytes: keep it out of pytest's long tmp paths.
        self._sockdir = Path(tempfile.mkdtemp(prefix="mdb"))
        self.socket = self._sockdir / "mariadb.sock"
        self.port = free_port()
        self.log = base / "mariadb.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mysql+pymysql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"

    def start(self, timeout: float = 60.0) -> "MariaDB":
        root = ["--user=root"] if os.geteuid() == 0 else []
        install = subprocess.run(
            [_binary("mariadb-install-db"), "--no-defaults", f"--datadir={self.datadir}", "--skip-test-db",
             "--auth-root-authentication-method=normal", *root],
            capture_output=True, text=True, timeout=120,
        )
        if install.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {install.stderr.strip()[-500:]}")
        self.process = subprocess.Popen(
            [_binary("mariadbd"), "--no-defaults", f"--datadir={self.datadir}", f"--socket={self.socket}",
             f"--port={self.port}", "--bind-address=127.0.0.1", f"--log-error={self.log}",
             f"--pid-file={self.base / 'mariadb.pid'}", "--innodb-buffer-pool-size=32M", *root],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                admin = pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True)
                break
            except pymysql.err.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"mariadbd did not start: {self.log_tail()}") from None
                time.sleep(0.2)
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DATABASE}")
            cur.execute(f"CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'")
            cur.execute(f"GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1'")
        admin.close()
        return self

    def query(self, sql: str) -> list[tuple]:
        conn = pymysql.connect(host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, database=DATABASE)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self._sockdir, ignore_errors=True)
