"""TLS contexts against a CA the test makes: verification both ways, and certificate reload.

Handshakes run in memory (ssl.MemoryBIO), so no sockets or threads are needed.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest

from metaq.security.errors import SecurityError
from metaq.security.tls import ReloadingServerContext, client_context, server_context
from tests.security_support import TestCA


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str | None = "127.0.0.1") -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """Run a TLS handshake between the two contexts through memory buffers; raises ssl.SSLError on failure."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(c_in, c_out, server_side=False, server_hostname=hostname)
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side, out, peer_in in (("client", client_side, c_out, s_in), ("server", server_side, s_out, c_in)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client certificate after its own handshake step;
            # exchange one record so a rejection shows up on the client.
            client_side.write(b"ping")
            s_in.write(c_out.read())
            assert server_side.read(4) == b"ping"
            return client_side, server_side
    raise AssertionError("handshake did not finish")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("pki")
    ca = TestCA.create(directory / "ca")
    rogue = TestCA.create(directory / "rogue", "rogue CA")
    files: dict[str, Path] = {"ca": ca.cert_file, "rogue_ca": rogue.cert_file}
    files["server_cert"], files["server_key"] = ca.issue("broker0")
    files["client_cert"], files["client_key"] = ca.issue("alice")
    files["rogue_cert"], files["rogue_key"] = rogue.issue("mallory")
    return files


def test_client_verifies_the_server_against_the_ca(pki: dict[str, Path]) -> None:
    server = server_context(str(pki["server_cert"]), str(pki["server_key"]))
    client_side, _ = handshake(server, client_context(str(pki["ca"])))
    assert client_side.version() in ("TLSv1.2", "TLSv1.3")
    assert dict(x[0] for x in client_side.getpeercert()["subject"])["commonName"] == "broker0"


def test_server_with_a_cert_from_another_ca_is_refused(pki: dict[str, Path]) -> None:
    server = server_context(str(pki["rogue_cert"]), str(pki["rogue_key"]))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client_context(str(pki["ca"])))


def test_host_name_is_checked_unless_turned_off(pki: dict[str, Path]) -> None:
    server = server_context(str(pki["server_cert"]), str(pki["server_key"]))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client_context(str(pki["ca"])), hostname="broker.example")
    handshake(server, client_context(str(pki["ca"]), check_hostname=False), hostname="broker.example")


def test_required_client_certificate(pki: dict[str, Path]) -> None:
    server = server_context(str(pki["server_cert"]), str(pki["server_key"]), str(pki["ca"]), "required")
    _, server_side = handshake(server, client_context(str(pki["ca"]), str(pki["client_cert"]), str(pki["client_key"])))
    assert dict(x[0] for x in server_side.getpeercert()["subject"])["commonName"] == "alice"
    with pytest.raises(ssl.SSLError):
        handshake(server, client_context(str(pki["ca"])))  # no certificate
    with pytest.raises(ssl.SSLError):
        handshake(server, client_context(str(pki["ca"]), str(pki["rogue_cert"]), str(pki["rogue_key"])))


def test_setup_errors_are_one_line(pki: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SecurityError, match="no such file"):
        server_context(str(tmp_path / "missing.crt"), str(pki["server_key"]))
    with pytest.raises(SecurityError, match="cannot load certificate"):
        server_context(str(pki["server_cert"]), str(pki["client_key"]))  # key of another certificate
    with pytest.raises(SecurityError, match="CA file"):
        server_context(str(pki["server_cert"]), str(pki["server_key"]), None, "required")
    with pytest.raises(SecurityError, match="client_auth"):
        server_context(str(pki["server_cert"]), str(pki["server_key"]), str(pki["ca"]), "sometimes")
    with pytest.raises(SecurityError, match="both"):
        client_context(str(pki["ca"]), str(pki["client_cert"]))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(SecurityError, match="cannot load CA"):
        client_context(str(garbage))


def _bump_mtime(*paths: Path) -> None:
    for path in paths:
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000_000))


def test_certificate_reload_without_restart(pki: dict[str, Path], tmp_path: Path) -> None:
    ca = TestCA.create(tmp_path / "ca2", "renewing CA")
    cert, key = ca.issue("broker-v1", file_stem="live")
    reloading = ReloadingServerContext(str(cert), str(key))
    live = reloading.context
    client = client_context(str(ca.cert_file))
    assert not reloading.maybe_reload()  # nothing changed

    def presented_name() -> str:
        client_side, _ = handshake(live, client)
        return dict(x[0] for x in client_side.getpeercert()["subject"])["commonName"]

    assert presented_name() == "broker-v1"
    ca.issue("broker-v2", file_stem="live")  # renewal writes new files in place
    _bump_mtime(cert, key)
    assert reloading.maybe_reload() and reloading.reloads == 1
    assert reloading.context is live  # the listener keeps its context object
    assert presented_name() == "broker-v2"


def test_a_bad_new_pair_keeps_the_old_certificate(tmp_path: Path) -> None:
    ca = TestCA.create(tmp_path / "ca3", "careful CA")
    cert, key = ca.issue("broker-v1", file_stem="live")
    reloading = ReloadingServerContext(str(cert), str(key))
    client = client_context(str(ca.cert_file))
    # Only the certificate was replaced so far: it does not match the key on disk.
    other_cert, _ = ca.issue("broker-v2", file_stem="other")
    cert.write_bytes(other_cert.read_bytes())
    _bump_mtime(cert)
    assert not reloading.maybe_reload()
    client_side, _ = handshake(reloading.context, client)
    assert dict(x[0] for x in client_side.getpeercert()["subject"])["commonName"] == "broker-v1"


def test_reload_checks_are_rate_limited(tmp_path: Path) -> None:
    ca = TestCA.create(tmp_path / "ca4", "slow CA")
    cert, key = ca.issue("b", file_stem="live")
    reloading = ReloadingServerContext(str(cert), str(key))
    assert not reloading.maybe_reload(min_interval=60)
    ca.issue("b2", file_stem="live")
    _bump_mtime(cert, key)
    assert not reloading.maybe_reload(min_interval=60)  # checked moments ago
    assert reloading.maybe_reload()
