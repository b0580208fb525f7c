"""The source's login options: which combinations are accepted, and that only paths travel in the plan."""

from __future__ import annotations

import pickle

import pytest

from metaq.spark.login import SparkLogin
from metaq.spark.options import OptionError, SourceOptions
from metaq.spark.reader import MetaQInputPartition

pytestmark = pytest.mark.spark

BASE = {"zkConnect": "127.0.0.1:2181", "topic": "t"}


def test_login_options_are_parsed_case_insensitively():
    opts = SourceOptions.parse({**BASE, "USER": "reader", "passwordfile": "/secrets/reader", "tlsca": "/tls/ca.pem"})
    assert opts.login == SparkLogin("reader", "/secrets/reader", "/tls/ca.pem")
    assert SourceOptions.parse(BASE).login == SparkLogin()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"user": "reader"}, "option user needs option passwordFile"),
        ({"passwordFile": "/secrets/reader"}, "option passwordFile needs option user"),
        ({"password": "secret"}, "unknown option(s) password"),
    ],
)
def test_incomplete_logins_are_refused(options, message):
    with pytest.raises(OptionError) as info:
        SourceOptions.parse({**BASE, **options})
    assert message in str(info.value)


def test_credentials_read_the_password_file_where_they_are_made(tmp_path):
    password_file = tmp_path / "reader.password"
    password_file.write_text("s3cret\nignored\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until a connection is made")
    creds = SparkLogin("reader", str(password_file), str(ca)).credentials()
    assert (creds.user, creds.password, creds.tls_ca_file) == ("reader", "s3cret", str(ca))
    assert "s3cret" not in repr(creds)
    with pytest.raises(OptionError, match=r"option passwordFile .*missing: cannot read a password on host"):
        SparkLogin("reader", str(tmp_path / "missing")).credentials()
    (tmp_path / "empty").write_text("")
    with pytest.raises(OptionError, match="option passwordFile .*its first line is empty"):
        SparkLogin("reader", str(tmp_path / "empty")).credentials()
    with pytest.raises(OptionError, match="option tlsCa .*nope.pem: no such file"):
        SparkLogin("reader", str(password_file), str(tmp_path / "nope.pem")).credentials()


def test_what_spark_pickles_holds_the_password_path_not_the_password(tmp_path):
    password_file = tmp_path / "reader.password"
    password_file.write_text("s3cret-password\n")
    opts = SourceOptions.parse({**BASE, "user": "reader", "passwordFile": str(password_file)})
    part = MetaQInputPartition("t", "0-0", 0, 0, 0, 10, (), "slave", BASE["zkConnect"], "/meta", 4096, 1000, login=opts.login)
    opts.login.credentials()  # reading the password must not leave it in the objects Spark ships
    for shipped in (pickle.dumps(opts), pickle.dumps(part)):
        assert str(password_file).encode() in shipped and b"s3cret-password" not in shipped


@pytest.mark.parametrize(
    "options, message",
    [
        ({"zkTlsCertFile": "/c.pem", "zkTlsKeyFile": "/k.pem"}, "need option zkTlsCaFile"),
        ({"zkTlsCaFile": "/ca.pem", "zkTlsCertFile": "/c.pem"}, "zkTlsCertFile and zkTlsKeyFile go together"),
        ({"zkTlsCaFile": "/ca.pem", "zkTlsVerifyHostname": "maybe"}, "zkTlsVerifyHostname must be true or false"),
    ],
)
def test_zookeeper_tls_options_are_checked_on_the_driver(options, message):
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse({**BASE, **options})


def test_zookeeper_tls_files_are_checked_where_the_client_starts(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    login = SourceOptions.parse({**BASE, "zktlscafile": str(ca), "zkTlsVerifyHostname": "false"}).login
    tls = login.zk_tls()
    assert tls is not None and tls.ca_file == str(ca) and tls.verify_hostname is False
    assert SparkLogin().zk_tls() is None  # the METAQ_ZK_TLS_* environment decides
    with pytest.raises(OptionError, match="options zkTls\\*: .*does not exist"):
        SparkLogin(zk_tls_ca=str(tmp_path / "missing.pem")).zk_tls()
