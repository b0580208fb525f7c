"""ZooKeeper over TLS: the one place a KazooClient is made, and the server side of `metaq zk`.

Every ZooKeeper client of the project (broker registry, client cluster view, CLI tools,
the Spark source and sink, the launcher) is created by ``make_kazoo_client`` so that the
TLS settings apply everywhere. Where they come from:

* the broker: ``zk.zkTlsCaFile``/``zk.zkTlsCertFile``/``zk.zkTlsKeyFile``/``zk.zkTlsVerifyHostname``
  in server.ini (metaq/config.py);
* a client: ``MetaClientConfig.zk_tls`` (metaq/client/config.py);
* tools and processes without either: the environment (``METAQ_ZK_TLS_CA`` and friends,
  ``ZkTls.from_env``), so ``metaq cluster``, ``metaq admin`` or a Spark job reach a
  TLS-only ZooKeeper without a flag on every command.

TLS protects the link (the digest login ``metaq-group-N:password`` and the group's writes
cross it); it is not an authorization: the ZooKeeper ACL digests (metaq/zk/acl.py) still
decide who may write what.
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

# The settings live with the configuration (a lower layer than this module); re-exported here.
from ..config import ENV_CA, ZkTls, ZkTlsError

__all__ = ["ZkServerTls", "ZkTls", "ZkTlsError", "describe_connect_failure", "make_kazoo_client", "tls_handshake_problem"]


def make_kazoo_client(hosts: str, *, tls: ZkTls | None = None, **kwargs: Any) -> KazooClient:
    """Every KazooClient of the project comes from here (so TLS applies to all of them).

    ``tls`` None means the environment's settings (``ZkTls.from_env``), else plaintext.
    """
    tls = tls if tls is not None else ZkTls.from_env()
    if tls is not None:
        kwargs.update(tls.kazoo_kwargs())
    return KazooClient(hosts=hosts, **kwargs)


def describe_connect_failure(connect: str, exc: BaseException | str | None, tls: ZkTls | None = None,
                             lead: str = "cannot reach ZooKeeper") -> str:
    """One line for a failed ZooKeeper start; names ZooKeeper TLS when a TLS setting is the cause.

    kazoo retries a failed handshake until its timeout and then reports only a timeout,
    so the cause is found by one handshake of our own with the same settings.
    """
    tls = tls if tls is not None else ZkTls.from_env()
    if tls is None:
        server = _first_tls_server(connect)
        if server:
            return (f"{lead} at {connect}: {server} speaks ZooKeeper TLS only and this client connects in plaintext"
                    f" (set zk.zkTlsCaFile, zk_tls or {ENV_CA})")
        return f"{lead} at {connect}: {exc or 'timed out'}"
    problem = tls_handshake_problem(connect, tls)
    if problem:
        return f"{lead} at {connect}: ZooKeeper TLS handshake failed: {problem}"
    return f"{lead} at {connect}: {exc or 'timed out'}"


def _servers(connect: str) -> list[tuple[str, str, int]]:
    """(as written, host, port) of each server of a connect string (a chroot suffix dropped)."""
    servers = []
    for server in connect.split("/", 1)[0].split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            servers.append((server.strip(), host.strip("[]") or server.strip(), int(port or 2181)))
        except ValueError:
            continue
    return servers


def _first_tls_server(connect: str, timeout: float = 3.0) -> str | None:
    """The first server of ``connect`` that answers a TLS hello like a TLS server (None: none does).

    A plaintext ZooKeeper reads the hello as a malformed request and closes the socket; a TLS
    server answers with its certificate, or with an alert when it wants a client certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only asks "is this TLS?": nothing is sent over it
    for written, host, port in _servers(connect):
        try:
            with socket.create_connection((host, port), timeout=timeout) as raw:
                with context.wrap_socket(raw, server_hostname=host):
                    return written
        except ssl.SSLError as exc:
            if "ALERT" in str(exc.reason or ""):
                return written
        except OSError:
            continue
    return None


def tls_handshake_problem(connect: str, tls: ZkTls, timeout: float = 3.0) -> str | None:
    """Why a TLS handshake with the first reachable server of ``connect`` fails (None: it works or nobody answers)."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as exc:
        # A file that exists but holds no PEM certificate: kazoo only times out on it, and
        # this is where the one line saying why is made, so it must not raise itself.
        return f"cannot load the CA file {tls.ca_file} (a PEM certificate bundle?): {exc}"
    context.check_hostname = tls.verify_hostname
    try:
        if tls.cert_file:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        return f"cannot load client certificate {tls.cert_file}: {exc}"
    for server, host, port in _servers(connect):
        try:
            with socket.create_connection((host, port), timeout=timeout) as raw:
                with context.wrap_socket(raw, server_hostname=host) as wrapped:
                    wrapped.do_handshake()
                    return None
        except ssl.SSLCertVerificationError as exc:
            return f"{server}: its certificate is not trusted ({exc.verify_message}; CA file {tls.ca_file})"
        except ssl.SSLError as exc:
            reason = str(exc.reason or exc)
            if "WRONG_VERSION_NUMBER" in reason or "wrong version number" in reason.lower():
                return f"{server} does not speak TLS (a plaintext port?)"
            if "BAD_CERTIFICATE" in reason or "CERTIFICATE_REQUIRED" in reason or "UNKNOWN_CA" in reason:
                hint = (f"is {tls.cert_file} signed by the CA the server trusts?" if tls.cert_file
                        else "set the client certificate and key for mutual TLS")
                return f"{server} refused our client certificate ({reason}; {hint})"
            return f"{server}: {reason}"
        except OSError:
            continue
    return None


# --- the server side (`metaq zk --tls-cert/--tls-key`) ------------------------------------------


@dataclass(frozen=True)
class ZkServerTls:
    """What the embedded ZooKeeper serves TLS with (PEM files).

    ``client_ca_file`` set: clients must present a certificate signed by it (mutual TLS,
    ``ssl.clientAuth=need``); unset: any client that trusts the server may connect.
    """

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def __post_init__(self) -> None:
        for what, path in (("certificate", self.cert_file), ("key", self.key_file), ("client CA", self.client_ca_file)):
            if path and not os.path.isfile(path):
                raise ZkTlsError(f"ZooKeeper TLS: {what} file {path} does not exist or is not a file")
        # Read them now, so a bad file is a one-line error before any JVM starts.
        try:
            self.key_store_pem()
            self.probe_context()
        except (OSError, ValueError, TypeError) as exc:  # ssl.SSLError is an OSError
            raise ZkTlsError(f"ZooKeeper TLS: cannot use certificate {self.cert_file} with key {self.key_file}: {exc}") from None
        if self.client_ca_file:
            self._check_client_ca()

    def _check_client_ca(self) -> None:
        """The client CA loads, and signed our own chain: ZooKeeper's trust manager would
        fail on a bad file inside the JVM, and the start-up probe (``probe_context``) presents
        the server's own certificate, so a server outside that CA would never be seen serving."""
        from cryptography import x509
        from cryptography.exceptions import InvalidSignature

        try:
            ssl.create_default_context(cafile=self.client_ca_file)
            authorities = x509.load_pem_x509_certificates(Path(self.client_ca_file).read_bytes())
        except (OSError, ValueError) as exc:
            raise ZkTlsError(f"ZooKeeper TLS: cannot use client CA {self.client_ca_file} "
                             f"(a PEM certificate bundle?): {exc}") from None
        chain = x509.load_pem_x509_certificates(Path(self.cert_file).read_bytes())
        for cert in chain:  # the leaf, or an intermediate the file carries
            for authority in authorities:
                try:
                    cert.verify_directly_issued_by(authority)
                    return
                except (ValueError, TypeError, InvalidSignature):
                    continue
        raise ZkTlsError(f"ZooKeeper TLS: client CA {self.client_ca_file} did not sign {self.cert_file}; with mutual TLS "
                         "the server's own certificate must be signed by it too (the start-up check presents it)")

    def key_store_pem(self) -> str:
        """ZooKeeper's PEM key store: the private key (PKCS#8) followed by the certificate chain."""
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_private_key(Path(self.key_file).read_bytes(), password=None)
        pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()).decode("ascii")
        return pkcs8 + Path(self.cert_file).read_text()

    def probe_context(self) -> ssl.SSLContext:
        """How is_serving talks to our own server: it checks the server by its dataDir, not its
        certificate; it presents the server's own certificate, which a client CA that signed
        the server accepts."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(self.cert_file, self.key_file)
        return context
