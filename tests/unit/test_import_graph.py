"""The import graph of ``metaq/`` and ``chaos/``: no cycle, and no import up the layers.

Every import statement counts: module level, inside functions, and under
``TYPE_CHECKING`` (a cycle hidden there is still a cycle a reader must untangle).
Edges go from a module to the module or package it names; ``from pkg import name``
points at ``pkg.name`` when that is a module, else at ``pkg``.

The layers are the rows of the Layers table in docs/architecture.md, lowest first:
each module belongs to the row naming the longest path that holds it, and imports
only modules of its own row or of rows above it.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import metaq

REPO = Path(metaq.__file__).parent.parent
PACKAGES = ("metaq", "chaos")
ARCHITECTURE = REPO / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=1)  # parsed once per run: the tests below only read it
def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for package in PACKAGES for path in (REPO / package).rglob("*.py")}
    # A compiled module (its C source, e.g. metaq/_speedups.c) is a module too, one
    # that imports nothing of ours.
    files.update({module_name(path): path for package in PACKAGES for path in (REPO / package).rglob("*.c")})
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        if path.suffix != ".py":
            continue
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


def layers(text: str) -> list[list[str]]:
    """The Layers table's rows, lowest first: per row the module prefixes its `where` names."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| layer ")]
    return [[module_of(path) for path in re.findall(r"`([^`]+)`", row.split("|")[2])] for row in rows]


def module_of(path: str) -> str:
    """`metaq/protocol/` -> metaq.protocol, `metaq/record.py` -> metaq.record, `metaq/__init__.py` -> metaq."""
    return path.strip("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def layer_of(module: str, table: list[list[str]]) -> int | None:
    """The row of the longest prefix that holds ``module`` (None: no row names it)."""
    best: tuple[int, int] | None = None  # (prefix length, row)
    for row, prefixes in enumerate(table):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), row)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]], table: list[list[str]]) -> list[str]:
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            mine, theirs = layer_of(name, table), layer_of(target, table)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{name} (row {mine + 1}) imports {target} (row {theirs + 1})")
    return out


def test_the_layer_check_sees_an_import_up_the_table() -> None:
    table = layers("## Layers\n| layer | where | what |\n|---|---|---|\n| low | `a/b.py`, `c/__init__.py` | |\n"
                   "| high | `a/` | |\n\n## Next\n| x | `z/` | |\n")
    assert table == [["a.b", "c"], ["a"]]
    assert layer_of("a.b", table) == 0 and layer_of("a.x.y", table) == 1 and layer_of("z", table) is None
    assert upward_imports({"a.b": {"a.x"}, "a.x": {"a.b", "c.d"}}, table) == ["a.b (row 1) imports a.x (row 2)"]


def test_the_graph_covers_chaos() -> None:
    graph = import_graph()
    assert "chaos.history" in graph["chaos.checker"]
    assert "metaq.record" in graph["chaos.history"]


def test_no_import_cycle_in_metaq_or_chaos() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_module_has_a_layer_and_no_layer_imports_a_higher_one() -> None:
    table = layers(ARCHITECTURE.read_text())
    graph = import_graph()
    homeless = sorted(name for name in graph if layer_of(name, table) is None)
    assert not homeless, f"modules in no row of the Layers table of docs/architecture.md: {homeless}"
    upward = upward_imports(graph, table)
    assert not upward, "imports up the layers of docs/architecture.md:\n" + "\n".join(upward)
