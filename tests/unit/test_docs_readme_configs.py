"""README: the example configs (``conf/``, ``async_slave.properties.example``) are
"documented key by key". Every key in them (the commented-out ones too) is one the
parser accepts, has its comment, and a default a comment states is the parser's default."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from metaq.config import ConfigError, parse_server_ini, parse_slave_properties

REPO = Path(__file__).resolve().parents[2]
INI_FILES = ["conf/server.ini", "conf/slave.ini", "conf/sync-pair/master.ini", "conf/sync-pair/slave.ini"]
PROPERTIES_FILES = ["async_slave.properties.example", "conf/sync-pair/slave.properties"]
# A key line; commented out, it has no space after the comment sign (prose always has one).
INI_KEY = re.compile(r"^;?([A-Za-z][\w.]*)=(.*)$")
PROPERTIES_KEY = re.compile(r"^#?([A-Za-z]\w*)=(.*)$")
# "(default 1000)", "Default: 500.", "(default `0 0 6,18 * * ?`: ...)"
STATED_DEFAULT = re.compile(r"\bdefault:?\s+(?:`([^`]+)`|([^\s;)`]+))", re.IGNORECASE)


@dataclass
class Entry:
    key: str
    value: str
    section: str | None
    active: bool  # False: commented out
    comment: list[str]  # the comment block directly above the run of key lines holding it
    run: int = 0  # how many key lines that block explains


def entries(path: str) -> list[Entry]:
    properties = path in PROPERTIES_FILES
    pattern, comment_signs = (PROPERTIES_KEY, "#!") if properties else (INI_KEY, ";#")
    found: list[Entry] = []
    section: str | None = None
    block: list[str] = []  # the comment lines right above the current run of key lines
    run: list[Entry] = []
    for raw in (REPO / path).read_text().splitlines():
        line = raw.strip()
        key = pattern.match(line)
        if key:
            entry = Entry(key.group(1), key.group(2).strip(), section, line[0] not in comment_signs, block)
            run.append(entry)
            found.append(entry)
            continue
        if run:  # a run of key lines ended: the next comment starts a new block
            for entry in run:
                entry.run = len(run)
            run, block = [], []
        if not line or line.startswith("["):
            block = []
            section = line[1:-1] if line.startswith("[") else section
        else:
            assert line[0] in comment_signs, f"{path}: {raw!r} is neither a key, a comment nor a section"
            block = [*block, line.lstrip(comment_signs).strip()]
    for entry in run:
        entry.run = len(run)
    return found


def comments(path: str) -> str:
    signs = "#!" if path in PROPERTIES_FILES else ";#"
    return "\n".join(line.strip() for line in (REPO / path).read_text().splitlines() if line.strip()[:1] in tuple(signs))


def explained_in(path: str) -> list[str]:
    """The example files whose comments this one's refer to (``explained in conf/server.ini``)."""
    text = comments(path)
    return [other for other in INI_FILES + PROPERTIES_FILES if other != path and Path(other).name in text
            and (other in text or Path(other).parent == Path(path).parent)]


def documented(path: str, key: str, seen: frozenset[str] = frozenset()) -> bool:
    """A comment right above the key, or one naming it here or in a file this one refers to."""
    if any(entry.key == key and entry.comment for entry in entries(path)):
        return True
    if re.search(rf"\b{re.escape(key)}\b", comments(path)):
        return True
    return any(documented(other, key, seen | {path}) for other in explained_in(path) if other not in seen | {path})


def ini_with(entry_list: list[Entry], *, all_keys: bool) -> bytes:
    sections: dict[str, list[str]] = {}
    for entry in entry_list:
        if entry.active or all_keys:
            sections.setdefault(entry.section or "", []).append(f"{entry.key}={entry.value}")
    return "".join(f"[{name}]\n" + "".join(f"{line}\n" for line in lines) for name, lines in sections.items()).encode()


@pytest.mark.parametrize("path", INI_FILES + PROPERTIES_FILES)
def test_every_key_of_an_example_config_has_its_comment(path):
    missing = sorted({entry.key for entry in entries(path) if not documented(path, entry.key)})
    assert not missing, f"{path}: keys without a comment: {missing}"


@pytest.mark.parametrize("path", INI_FILES)
def test_every_key_of_an_example_server_ini_is_accepted_commented_out_ones_too(path):
    parse_server_ini((REPO / path).read_bytes(), "server.ini")
    parse_server_ini(ini_with(entries(path), all_keys=True), "server.ini")  # ConfigError names the key


@pytest.mark.parametrize("path", PROPERTIES_FILES)
def test_every_key_of_an_example_slave_properties_is_accepted(path):
    config = parse_slave_properties((REPO / path).read_text(), path)
    assert config.slave_id == 0


def stated_defaults(path: str) -> list[tuple[Entry, str]]:
    """(key, value) pairs a comment says are the defaults: "(default V)" in a comment that
    explains one key, or each key under a comment ending "the defaults:"."""
    stated = []
    for entry in entries(path):
        if not entry.comment:
            continue
        if entry.comment[-1].endswith("the defaults:"):
            stated.append((entry, entry.value))
        elif entry.run == 1:
            match = STATED_DEFAULT.search(" ".join(entry.comment))
            if match:
                stated.append((entry, match.group(1) or match.group(2).rstrip(".,:")))
    return stated


def test_the_stated_defaults_are_found_where_expected():
    keys = {entry.key for entry, _ in stated_defaults("conf/server.ini")}
    assert {"hostName", "serverPort", "unflushThreshold", "deletePolicy", "deleteWhen", "maxConnections",
            "scrubIntervalMs", "zk.zkSessionTimeoutMs", "zk.zkRoot"} <= keys, keys
    assert {entry.key for entry, _ in stated_defaults("async_slave.properties.example")} == {
        "slaveGroup", "slaveMaxDelayInMills", "autoSyncMasterConfig"}


@pytest.mark.parametrize("path", INI_FILES)
def test_a_default_an_example_server_ini_states_is_the_parsers(path):
    def normalized(data: bytes):
        return replace(parse_server_ini(data, "server.ini"), raw=b"", checksum=0)

    for entry, value in stated_defaults(path):
        # A topic key's default is its [system] default.
        section = "[zookeeper]\n" if entry.section == "zookeeper" else ""
        try:
            with_value = normalized(f"[system]\nbrokerId=0\n{section}{entry.key}={value}\n".encode())
        except ConfigError as exc:
            raise AssertionError(f"{path}: {entry.key}: the stated default {value!r} is refused: {exc}") from None
        assert with_value == normalized(b"[system]\nbrokerId=0\n"), f"{path}: {entry.key}: {value!r} is not the default"


@pytest.mark.parametrize("path", PROPERTIES_FILES)
def test_a_default_an_example_slave_properties_states_is_the_parsers(path):
    for entry, value in stated_defaults(path):
        value = value.replace("{slaveId}", "0")
        assert parse_slave_properties(f"slaveId=0\n{entry.key}={value}\n") == parse_slave_properties("slaveId=0\n"), (
            f"{path}: {entry.key}: {value!r} is not the default")


@pytest.mark.parametrize("path", INI_FILES + PROPERTIES_FILES)
def test_the_files_and_docs_an_example_config_names_exist(path):
    named = set(re.findall(r"\b((?:conf|docs)/[\w./-]*\w)", comments(path)))
    assert all((REPO / name).exists() for name in named), sorted(name for name in named if not (REPO / name).exists())
