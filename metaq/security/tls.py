"""``ssl.SSLContext`` builders for the broker's listener and for connecting clients and brokers.

Both sides use TLS 1.2 or newer with the standard library's default ciphers. A server
context with ``client_auth`` ``optional``/``required`` verifies client certificates against
``ca_file`` (mutual TLS). A client context verifies the server against ``ca_file`` (or the
system store) and checks the host name unless told not to (brokers addressed by IP).

Certificates are renewed without a restart: ``ReloadingServerContext.maybe_reload()``
compares the files' modification stamps and loads a changed chain into the *same*
context, so the listener keeps its context object and new handshakes present the new
certificate while open connections carry on. A changed pair is first loaded into a
scratch context, so a half-written or mismatched pair is refused and the old one kept.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from dataclasses import dataclass, field

from .errors import SecurityError

log = logging.getLogger(__name__)

CLIENT_AUTH_MODES = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError:
        # ssl does not say which of the two is missing (its filename is None).
        missing = [path for path in (cert_file, key_file) if not os.path.exists(path)] or [cert_file]
        raise SecurityError(f"TLS: cannot read {', '.join(missing)}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise SecurityError(f"TLS: cannot load certificate {cert_file} with key {key_file}: {exc}") from None


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except FileNotFoundError:
        raise SecurityError(f"TLS: cannot read CA file {ca_file}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise SecurityError(f"TLS: cannot load CA file {ca_file}: {exc}") from None


def server_context(cert_file: str, key_file: str, ca_file: str | None = None, client_auth: str = "none") -> ssl.SSLContext:
    if client_auth not in CLIENT_AUTH_MODES:
        raise SecurityError(f"TLS: client_auth must be one of {', '.join(CLIENT_AUTH_MODES)}, got {client_auth!r}")
    if client_auth != "none" and ca_file is None:
        raise SecurityError("TLS: verifying client certificates needs a CA file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert_file, key_file)
    if ca_file is not None:
        _load_ca(context, ca_file)
    context.verify_mode = CLIENT_AUTH_MODES[client_auth]
    return context


def client_context(
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    *,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A context that verifies the server; with ``cert_file``/``key_file`` it also presents a certificate."""
    if (cert_file is None) != (key_file is None):
        raise SecurityError("TLS: a client certificate needs both a certificate file and a key file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file is not None:
        _load_ca(context, ca_file)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if cert_file is not None and key_file is not None:
        _load_chain(context, cert_file, key_file)
    return context


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino


@dataclass
class ReloadingServerContext:
    """A server context whose certificate chain follows its files."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    client_auth: str = "none"
    context: ssl.SSLContext = field(init=False)
    reloads: int = field(default=0, init=False)
    _stamps: tuple = field(init=False, repr=False)
    _checked_at: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.context = server_context(self.cert_file, self.key_file, self.ca_file, self.client_auth)
        self._stamps = self._current_stamps()

    def _current_stamps(self) -> tuple:
        return tuple(_stamp(path) for path in (self.cert_file, self.key_file, self.ca_file) if path is not None)

    def maybe_reload(self, min_interval: float = 0.0) -> bool:
        """Reload the chain (and CA) if a file changed; True when it did. Never raises for a bad new pair."""
        now = time.monotonic()
        if min_interval and now - self._checked_at < min_interval:
            return False
        self._checked_at = now
        stamps = self._current_stamps()
        if stamps == self._stamps:
            return False
        try:
            # Prove the new files load together before touching the live context.
            server_context(self.cert_file, self.key_file, self.ca_file, self.client_auth)
        except SecurityError as exc:
            log.warning("TLS: keeping the current certificate: %s", exc)
            return False
        _load_chain(self.context, self.cert_file, self.key_file)
        if self.ca_file is not None:
            _load_ca(self.context, self.ca_file)
        self._stamps = stamps
        self.reloads += 1
        log.info("TLS: reloaded certificate %s", self.cert_file)
        return True

