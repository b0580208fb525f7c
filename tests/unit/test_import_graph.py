"""The import graph of ``metaq/`` has no cycle.

Every import statement counts: module level, inside functions, and under
``TYPE_CHECKING`` (a cycle hidden there is still a cycle a reader must untangle).
Edges go from a module to the module or package it names; ``from pkg import name``
points at ``pkg.name`` when that is a module, else at ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import metaq

ROOT = Path(metaq.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in files else stem for alias in node.names]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]  # `import metaq.a.b` names module metaq.a.b
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path that starts and ends at the same module, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {name: WHITE for name in graph}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        colour[name] = GREY
        stack.append(name)
        for target in sorted(graph[name]):
            if colour[target] == GREY:
                return stack[stack.index(target):] + [target]
            if colour[target] == WHITE and (cycle := visit(target)) is not None:
                return cycle
        stack.pop()
        colour[name] = BLACK
        return None

    for name in sorted(graph):
        if colour[name] == WHITE and (cycle := visit(name)) is not None:
            return cycle
    return None


def test_the_finder_sees_a_cycle_hidden_in_a_function() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_counts_function_level_and_type_checking_imports() -> None:
    graph = import_graph()
    # server/broker starts the HA layer; the edge must be seen wherever the import sits.
    assert "metaq.ha.node" in graph["metaq.server.broker"]
    assert "metaq.protocol.commands" in graph["metaq.server.handlers"]


def test_metaq_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
