"""The shape of the code: no import cycle among the project's modules, and no module over 400 lines.

The layer contracts themselves are checked by `lint-imports` (`make lint`, run by `make test`); this test adds what
import-linter does not check: cycles inside a package, and module size.
"""

from __future__ import annotations

from pathlib import Path

import grimp

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGES: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]

MAX_LINES = 400
# Modules allowed over MAX_LINES, each for a stated reason; keep this list short and shrinking.
OVERSIZE_ALLOWED: set[str] = set()


def _strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm, iterative: every strongly connected component of the project's import graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & graph.modules) for m in graph.modules}
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    components.append(sorted(component))
    return components


def _cycle_in(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """One concrete cycle through the component's first module, for the failure message."""
    first, members = component[0], set(component)
    for nxt in sorted(graph.find_modules_directly_imported_by(first) & members):
        chain = graph.find_shortest_chain(importer=nxt, imported=first)
        if chain:
            return [first, *chain]
    return component


def test_cycle_finder_finds_cycles() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.d", "p.e"),
                               ("p.e", "p.d"), ("p.f", "p.a")]:
        graph.add_import(importer=importer, imported=imported)
    components = sorted(_strongly_connected(graph))
    assert components == [["p.a", "p.b", "p.c"], ["p.d", "p.e"], ["p.f"]]
    assert _cycle_in(graph, ["p.a", "p.b", "p.c"]) == ["p.a", "p.b", "p.c", "p.a"]


def test_no_import_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)  # no cache directory in the tree
    cycles = [_cycle_in(graph, c) for c in _strongly_connected(graph) if len(c) > 1]
    details = "\n".join(" -> ".join(c) for c in cycles)
    assert not cycles, f"import cycles among the project's modules:\n{details}"


def test_no_module_over_400_lines() -> None:
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
             for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    assert len(sizes) > 50  # the packages were found
    over = {path: n for path, n in sizes.items() if n > MAX_LINES and path not in OVERSIZE_ALLOWED}
    assert not over, f"modules over {MAX_LINES} lines (split them, or justify them in OVERSIZE_ALLOWED): {over}"
    stale = {path for path in OVERSIZE_ALLOWED if sizes.get(path, 0) <= MAX_LINES}
    assert not stale, f"allowed to be over {MAX_LINES} lines but no longer are (drop them from the list): {stale}"
