"""A partition log is appended to and truncated only by its owner (metaq/server/partitions.py).

Everything else gets the log to read (``ha/host.py : LogReader``). This scan of ``metaq/``
finds every call of a log's writing methods on something named like a log outside the
owner and the store itself (the store lays logs out, recovers them and runs retention below
the owner), so a new ``partition_log.append(...)`` or ``owner.log.truncate_to(...)`` in a
handler or the HA layer fails here rather than in a chaos run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import metaq

PACKAGE = Path(metaq.__file__).parent
#: The log's writing methods (metaq/store/log.py : PartitionLog).
WRITERS = {"append", "truncate_to", "truncate_fully_and_start_at", "repair_corrupt"}
#: Where they may be called: the partition's owner, and the store below it.
ALLOWED = {"server/partitions.py"}
ALLOWED_UNDER = ("store/",)
#: A receiver that names a log: ``log``, ``log_``, ``self.log``, ``owner.log``, ``partition_log``,
#: ``replica.log``, ``store.get_log(t, p)``, ``logs[key]`` ...
LOG_LIKE = re.compile(r"(^|[._(\[])(\w*_)?(log|log_|logs\(\)|get_log\(.*\)|get_or_create_log\(.*\)|open_log\(.*\))(\[.*\])?$")


def log_writes(source: str) -> list[tuple[int, str, str]]:
    """``(line, receiver, method)`` of every call of a log writer on a log-like receiver in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITERS:
            receiver = ast.unparse(node.func.value)
            if LOG_LIKE.search(receiver):
                found.append((node.lineno, receiver, node.func.attr))
    return found


def test_the_scan_finds_the_writes_it_must_refuse() -> None:
    source = "\n".join([
        "log.append(data)",
        "self.log.truncate_to(5)",
        "owner.log.truncate_fully_and_start_at(0)",
        "partition_log.append(b'')",
        "log_.repair_corrupt(0, b'')",
        "self.host.store.get_log(t, p).append(data)",
        "store.logs()[key].truncate_to(0)",
        "replica.log.append(data)",
        # not a log: a list, and the owner's own methods
        "pending.append(x)",
        "self.host.partitions.get(t, p).truncate_to(end)",
        "owner.append_as_follower(data)",
        "catalog.append(x)",
    ])
    assert [line for line, _receiver, _method in log_writes(source)] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_only_the_partition_owner_appends_to_or_truncates_a_log() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in ALLOWED or relative.startswith(ALLOWED_UNDER):
            continue
        offenders += [f"metaq/{relative}:{line}: {receiver}.{method}(...)"
                      for line, receiver, method in log_writes(path.read_text())]
    assert not offenders, "only metaq/server/partitions.py writes a partition log:\n" + "\n".join(offenders)


def test_the_owner_is_where_the_writes_are() -> None:
    """The allowed module does write the log (the scan would find a rename that moved them)."""
    writes = log_writes((PACKAGE / "server/partitions.py").read_text())
    assert {method for _line, _receiver, method in writes} == WRITERS


#: The one leader append entry (``Partition.append_as_leader``) and who calls it: the put
#: handler and the transaction service's markers; nothing else appends on a master.
LEADER_ENTRY_CALLERS = {"server/handlers.py", "server/transactions.py"}
#: What the entry does in one step, which no caller may do on its own beside it.
ENTRY_STEPS = {"stamp_msg_ids", "push"}


def _calls(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every call of a function or method named in ``names``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in names:
                found.append((node.lineno, name))
    return found


def test_every_leader_append_goes_through_the_partitions_one_entry() -> None:
    """Puts and transaction markers both call ``append_as_leader``, nothing else does, and
    the steps it takes together (stamping the msg ids, pushing to streaming slaves) are
    taken nowhere else: a new writer that stamps and appends by itself fails here."""
    assert _calls("stamp_msg_ids(data, 1)\nhub.push(key, 0, 1, data)\nowner.append_as_leader(data, 1)\n",
                  {"append_as_leader", *ENTRY_STEPS}) == [(1, "stamp_msg_ids"), (2, "push"), (3, "append_as_leader")]
    callers: dict[str, int] = {}
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        source = path.read_text()
        for line, name in _calls(source, {"append_as_leader", *ENTRY_STEPS}):
            if name == "append_as_leader":
                callers[relative] = callers.get(relative, 0) + 1
            elif relative not in ("server/partitions.py", "ha/stream.py"):
                strays.append(f"metaq/{relative}:{line}: {name}(...)")
    assert set(callers) == LEADER_ENTRY_CALLERS, f"append_as_leader is called from {sorted(callers)}"
    assert not strays, "a step of the leader append entry taken outside it:\n" + "\n".join(strays)
    entry = _calls((PACKAGE / "server/partitions.py").read_text(), {"stamp_msg_ids", "push", "appended", "write_refusal"})
    assert {name for _line, name in entry} == {"stamp_msg_ids", "push", "appended", "write_refusal"}
