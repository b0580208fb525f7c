"""The modules that take the whole broker use only what their protocol names.

``group_topics`` (its topic applier, and ``forget_partitions``), ``reload`` and ``metrics``
each type the broker against a narrow ``typing.Protocol`` (as ``TxnHost`` and ``BrokerHost``
are). Nothing checks a protocol at run time, so this test reads the source: every attribute taken of a protocol-typed
``broker`` parameter (or of ``self.broker`` in a class built with one) must be a member
of that protocol, the broker may be handed on only to callees listed here (whose own
needs are checked too), every member must be used (the protocol stays narrow), and
every member must exist on ``Broker`` (the protocol stays true).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "metaq"

#: (module, one of its protocols) -> callees elsewhere the broker may be handed to -> what they
#: use of it. Functions and classes of the module itself that take the same protocol are scanned alike.
MODULES = {
    ("server/group_topics.py", "TopicsBroker"): {"peer_topics": ("ha/host.py", "PeerCredentials")},
    ("server/group_topics.py", "PartitionHolders"): {},
    ("server/reload.py", "ReloadedBroker"): {},
    ("server/metrics.py", "MeasuredBroker"): {},
}


def _tree(relative: str) -> ast.Module:
    return ast.parse((ROOT / relative).read_text())


def protocol_members(tree: ast.Module, name: str) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            assert any(isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases), f"{name} is not a Protocol"
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            return members
    raise AssertionError(f"no protocol {name}")


def _annotated(arg: ast.arg, protocol: str) -> bool:
    return isinstance(arg.annotation, ast.Name) and arg.annotation.id == protocol or (
        isinstance(arg.annotation, ast.Constant) and arg.annotation.value == protocol)


def _is_broker(node: ast.AST, self_scope: bool) -> bool:
    """``broker`` (the parameter, or an alias of ``self.broker`` by that name), or ``self.broker``."""
    if isinstance(node, ast.Name) and node.id == "broker":
        return True
    return self_scope and isinstance(node, ast.Attribute) and node.attr == "broker" and (
        isinstance(node.value, ast.Name) and node.value.id == "self")


def broker_uses(tree: ast.Module, protocol: str) -> tuple[set[str], list[tuple[str, int]]]:
    """Attributes taken of the protocol-typed broker, and the calls it is handed to (callee, line)
    outside the module's own scopes that take it.

    Scopes: every function with a ``broker: <protocol>`` parameter, and every method of a
    class whose ``__init__`` takes one (there ``self.broker`` is it too)."""
    scopes: list[tuple[ast.AST, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is not None and any(_annotated(a, protocol) for a in init.args.args if a.arg == "broker"):
                scopes.append((node, True))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(_annotated(a, protocol) for a in node.args.args if a.arg == "broker"):
                scopes.append((node, False))
    assert scopes, f"nothing takes a broker typed {protocol}"
    used: set[str] = set()
    handed: list[tuple[str, int]] = []
    for scope, self_scope in scopes:
        understood = set()  # ids of the broker's appearances accounted for
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and _is_broker(node.value, self_scope):
                used.add(node.attr)
                understood.add(id(node.value))
            elif isinstance(node, ast.Call):
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    if _is_broker(arg, self_scope):
                        callee = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
                        handed.append((callee, node.lineno))
                        understood.add(id(arg))
            elif isinstance(node, ast.Assign) and _is_broker(node.value, self_scope) and all(
                    _is_broker(target, True) for target in node.targets):
                understood.add(id(node.value))  # ``broker = self.broker`` / ``self.broker = broker``
        for node in ast.walk(scope):
            if (_is_broker(node, self_scope) and isinstance(getattr(node, "ctx", None), ast.Load)
                    and id(node) not in understood):
                # Returned, stored elsewhere, put in a container: its uses could not be checked.
                raise AssertionError(f"{protocol}: the broker escapes at line {node.lineno}")
    own = {getattr(scope, "name", "") for scope, _ in scopes}
    return used, [(callee, line) for callee, line in handed if callee not in own]


def broker_members() -> set[str]:
    """What ``Broker`` has: class members and the attributes its ``__init__`` or ``start`` set."""
    tree = _tree("server/broker.py")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Broker")
    members = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                members.add(target.attr)
    return members


@pytest.mark.parametrize(("module", "protocol"), sorted(MODULES))
def test_the_module_uses_only_its_protocol_of_the_broker(module: str, protocol: str) -> None:
    callees = MODULES[(module, protocol)]
    tree = _tree(module)
    members = protocol_members(tree, protocol)
    used, handed = broker_uses(tree, protocol)
    assert used <= members, f"{module} uses {sorted(used - members)} of the broker outside {protocol}"
    passed_on: set[str] = set()
    for callee, line in handed:
        assert callee in callees, f"{module}:{line} hands the broker to {callee}, which this test does not know"
        callee_module, callee_protocol = callees[callee]
        needs = protocol_members(_tree(callee_module), callee_protocol)
        assert needs <= members, f"{callee} needs {sorted(needs - members)}, outside {protocol}"
        passed_on |= needs
    assert members <= used | passed_on, f"{protocol} names {sorted(members - used - passed_on)}, which {module} never uses"
    assert members <= broker_members(), f"{protocol} names {sorted(members - broker_members())}, which Broker lacks"


def test_peers_use_only_the_credentials() -> None:
    """``peer_topics`` / ``open_peer`` read only ``security`` of what they are given."""
    tree = _tree("ha/peers.py")
    members = protocol_members(_tree("ha/host.py"), "PeerCredentials")
    used = {
        node.attr for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "host"
    }
    assert used == members


def test_the_scan_sees_a_member_outside_the_protocol() -> None:
    """The check can fail: a use of a member the protocol lacks is found."""
    source = (
        "from typing import Protocol\n"
        "class P(Protocol):\n"
        "    config: int\n"
        "class C:\n"
        "    def __init__(self, broker: P) -> None:\n"
        "        self.broker = broker\n"
        "    def run(self) -> None:\n"
        "        broker = self.broker\n"
        "        broker.config\n"
        "        self.broker.store.logs()\n"
        "def f(broker: P) -> None:\n"
        "    g(broker)\n"
    )
    used, handed = broker_uses(ast.parse(source), "P")
    assert used - protocol_members(ast.parse(source), "P") == {"store"}
    assert handed == [("g", 12)]
    with pytest.raises(AssertionError, match="escapes"):
        broker_uses(ast.parse(source + "def h(broker: P) -> object:\n    return broker\n"), "P")
