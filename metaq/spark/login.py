"""How the ``metaq`` Spark source logs in to brokers with security on: options ``user``,
``passwordFile`` and ``tlsCa`` (the CLI's ``--user``, ``--password-file``, ``--tls-ca``).

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
from .options_error import OptionError

LOGIN_OPTIONS = ("user", "passwordFile", "tlsCa")


def _text(options: Mapping[str, str], name: str) -> str | None:
    value = str(options.get(name) or "").strip()
    return value or None


@dataclass(frozen=True)
class SparkLogin:
    user: str | None = None
    password_file: str | None = None
    #: CA bundle that signed the brokers' certificates: connect over TLS and verify them.
    tls_ca: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SparkLogin":
        """From canonical option names; a user needs a password file and vice versa."""
        user, password_file, tls_ca = (_text(options, name) for name in LOGIN_OPTIONS)
        if user is not None and password_file is None:
            # Not a password option: its value would be in the query plan, the UI and logs.
            raise OptionError(
                "option user needs option passwordFile: a file readable on the driver and every executor "
                "whose first line is the password"
            )
        if password_file is not None and user is None:
            raise OptionError("option passwordFile needs option user (the user to log in as)")
        return cls(user, password_file, tls_ca)

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

    def _unreadable(self, why: str) -> OptionError:
        return OptionError(f"option passwordFile {self.password_file}: cannot read a password on host {socket.gethostname()}: {why}")
