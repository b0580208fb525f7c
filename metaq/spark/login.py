"""How the ``metaq`` Spark source and sink log in to brokers with security on: options ``user``,
``passwordFile`` and ``tlsCa`` (the CLI's ``--user``, ``--password-file``, ``--tls-ca``); and
how they reach a ZooKeeper that speaks TLS only: ``zkTlsCaFile``, ``zkTlsCertFile``,
``zkTlsKeyFile``, ``zkTlsVerifyHostname`` (the broker's ``zk.zkTls*`` keys; without them the
``METAQ_ZK_TLS_*`` environment of each process applies, as for every client).

Only paths travel in the plan: ``SparkLogin`` is part of the options, of the pickled reader
and of every input partition, so it must never hold the password. The password file is
read where a connection is opened (on the driver for planning, on each executor inside
``read()``), which is why the path must be readable on every executor; the password then
lives only in that process's ``Credentials``, whose repr hides it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..client.connection import Credentials
from ..config import ZkTls, ZkTlsError
from .options_error import OptionError

ZK_TLS_OPTIONS = ("zkTlsCaFile", "zkTlsCertFile", "zkTlsKeyFile", "zkTlsVerifyHostname")
LOGIN_OPTIONS = ("user", "passwordFile", "tlsCa", *ZK_TLS_OPTIONS)


def _text(options: Mapping[str, str], name: str) -> str | None:
    value = str(options.get(name) or "").strip()
    return value or None


@dataclass(frozen=True)
class SparkLogin:
    user: str | None = None
    password_file: str | None = None
    #: CA bundle that signed the brokers' certificates: connect over TLS and verify them.
    tls_ca: str | None = None
    #: ZooKeeper over TLS: its CA bundle (turns TLS on), an optional client certificate and key.
    zk_tls_ca: str | None = None
    zk_tls_cert: str | None = None
    zk_tls_key: str | None = None
    zk_tls_verify_hostname: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SparkLogin":
        """From canonical option names; a user needs a password file and vice versa."""
        user, password_file, tls_ca, zk_ca, zk_cert, zk_key, zk_verify = (_text(options, name) for name in LOGIN_OPTIONS)
        if user is not None and password_file is None:
            # Not a password option: its value would be in the query plan, the UI and logs.
            raise OptionError(
                "option user needs option passwordFile: a file readable on the driver and every executor "
                "whose first line is the password"
            )
        if password_file is not None and user is None:
            raise OptionError("option passwordFile needs option user (the user to log in as)")
        if (zk_cert or zk_key or zk_verify) and zk_ca is None:
            raise OptionError("options zkTlsCertFile, zkTlsKeyFile and zkTlsVerifyHostname need option zkTlsCaFile (which turns ZooKeeper TLS on)")
        if bool(zk_cert) != bool(zk_key):
            raise OptionError("options zkTlsCertFile and zkTlsKeyFile go together (a client certificate and its key)")
        verify = (zk_verify or "true").lower()
        if verify not in ("true", "false"):
            raise OptionError(f"option zkTlsVerifyHostname must be true or false, got {zk_verify!r}")
        return cls(user, password_file, tls_ca, zk_ca, zk_cert, zk_key, verify == "true")

    def credentials(self) -> Credentials:
        """The login of this process: reads the password file and checks the CA file here."""
        password = None
        if self.password_file is not None:
            try:
                password = next(iter(Path(self.password_file).read_text().splitlines()), "")
            except OSError as exc:
                raise self._unreadable(str(exc)) from None
            if not password:
                raise self._unreadable("its first line is empty")
        if self.tls_ca is not None and not Path(self.tls_ca).is_file():
            raise OptionError(f"option tlsCa {self.tls_ca}: no such file on host {socket.gethostname()}")
        return Credentials(self.user, password, self.tls_ca)

    def zk_tls(self) -> ZkTls | None:
        """ZooKeeper TLS settings of this process (None: the METAQ_ZK_TLS_* environment decides)."""
        if self.zk_tls_ca is None:
            return None
        try:
            return ZkTls(self.zk_tls_ca, self.zk_tls_cert, self.zk_tls_key, self.zk_tls_verify_hostname)
        except ZkTlsError as exc:
            raise OptionError(f"options zkTls*: {exc} (on host {socket.gethostname()})") from None

    def _unreadable(self, why: str) -> OptionError:
        return OptionError(f"option passwordFile {self.password_file}: cannot read a password on host {socket.gethostname()}: {why}")
