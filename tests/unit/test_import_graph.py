"""The rooms of the code and who may import whom (docs/ARCHITECTURE.md draws the same table).

The graph holds every import written in a module: at its top, inside a function, under
``if TYPE_CHECKING`` (an annotation-only import is still a dependency of the reader and of the
type checker), and relative ones resolved to their absolute names. Two checks hold it:

- no import circles among modules;
- every edge between rooms is allowed by :data:`MAY_IMPORT`, except the named edges of
  :data:`EXCEPTIONS`, each a debt with its reason; an exception no longer used fails the test
  too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "executor", "learned")

#: Small modules the lower rooms share: the public data manifest, cluster specs, YAML documents
#: and provenance hashes (files, no service state).
SUPPORT = ("service.data", "service.cluster", "service.document", "service.provenance", "service.environment")

#: room -> the rooms its modules may import (besides their own). ``sim`` is one room of four
#: folders, as the issue's table has it: the simulator, traces and workloads, model families and
#: tracing, and the cost models (``service/sim``, ``service/workload``, ``service/models``, ``learned``).
MAY_IMPORT: dict[str, set[str]] = {
    "domain": set(),
    "support": {"domain"},
    "core": {"domain"},
    "sim": {"domain", "core", "support"},
    "graph": {"domain", "core", "support"},
    "live": {"domain", "core", "support", "sim", "graph"},
    "api": {"domain", "live"},
    "replay": {"domain", "core", "support", "sim"},
    "executor": {"domain", "core", "support", "sim"},
    "harness": {"domain", "core", "support", "sim", "graph", "live", "api", "replay", "executor", "cli"},
    "cli": {"domain", "core", "support", "sim", "graph", "live", "api", "replay", "executor", "harness"},
}

#: (importer, imported) module edges that break the table, with why they are still there. None are
#: left; a new one needs its reason here (and fails the test once it is no longer used).
EXCEPTIONS: dict[tuple[str, str], str] = {}


#: Annotation-only edges left out of the circle check, with why. None are left: the live service's
#: parts are objects given the few collaborators they use, none holds the whole service.
CIRCLE_EXCEPTIONS: dict[tuple[str, str], str] = {}


def room_of(module: str) -> str:
    if module.startswith(SUPPORT):
        return "support"
    if module.startswith("service.webconsole"):
        return "api"
    top, _, rest = module.partition(".")
    if top == "executor":
        return top
    if top == "learned":
        return "sim"
    room = rest.split(".")[0] if rest else "service"
    return "sim" if room in ("workload", "models") else room


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(module: str, is_package: bool, tree: ast.AST, modules: set[str]) -> set[str]:
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            subs = [f"{base}.{a.name}" for a in node.names]
            # ``from pkg import module`` depends on the module; ``from pkg import name`` on pkg
            names = [*subs, *([base] if not all(s in modules for s in subs) else [])]
        else:
            continue
        found |= {n for n in names if n in modules}
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    modules = set(files)
    return {m: _imports(m, p.name == "__init__.py", ast.parse(p.read_text()), modules) - {m}
            for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def room_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets
            if room_of(a) != room_of(b) and room_of(b) not in MAY_IMPORT[room_of(a)]}


def test_the_finder_sees_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_counts_type_checking_and_relative_imports() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from service.live.service import X\n"
                     "from .records import Y\n")
    found = _imports("service.live.state", False, tree, {"service.live.service", "service.live.records"})
    assert found == {"service.live.service", "service.live.records"}


def test_every_module_has_a_room() -> None:
    rooms = {room_of(m) for m in import_graph()} - {"service"}
    assert rooms <= set(MAY_IMPORT), rooms - set(MAY_IMPORT)


def test_no_import_circles() -> None:
    graph = import_graph()
    for importer, imported in CIRCLE_EXCEPTIONS:
        assert imported in graph[importer], f"exception no longer needed: {importer} -> {imported}"
        graph[importer].discard(imported)
    assert cycles(graph) == []


def test_rooms_import_only_what_the_table_allows() -> None:
    found = room_violations(import_graph())
    assert found - set(EXCEPTIONS) == set(), "imports that break the room table"
    assert set(EXCEPTIONS) - found == set(), "exceptions no longer needed: remove them from EXCEPTIONS"
