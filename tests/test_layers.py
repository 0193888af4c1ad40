"""The shape of the code: no import cycle among the project's modules, and no module over 400 lines.

The layer contracts themselves are checked by `lint-imports` (`make lint`, run by `make test`); this test adds what
import-linter does not check: cycles inside a package, imports import-linter cannot see (a package entry point, or a
module named in a string to ``importlib.import_module``/``__import__``) against the same layers, and module size.
(grimp already sees imports inside functions and under ``TYPE_CHECKING``.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES: list[str] = PYPROJECT["tool"]["importlinter"]["root_packages"]
LAYERS: list[str] = next(c for c in PYPROJECT["tool"]["importlinter"]["contracts"]
                         if c["type"] == "layers" and "containers" not in c and c["layers"][-1] == "poolpipe_common"
                         )["layers"]

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


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def hidden_imports(module: str, source: str, modules: set[str], groups: dict[str, list[str]]) -> set[tuple[str, str]]:
    """Edges import-linter cannot see in ``source``: project modules named in strings where the module calls
    ``import_module``/``__import__``, and the targets of every entry-point group whose name the module mentions."""
    tree = ast.parse(source)
    names = {n.id if isinstance(n, ast.Name) else n.attr
             for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute))}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    edges: set[tuple[str, str]] = set()
    if names & {"import_module", "__import__"}:
        edges |= {(module, s.split(":")[0]) for s in strings if s.split(":")[0] in modules and s != module}
    for group, targets in groups.items():
        if group in strings:
            edges |= {(module, t) for t in targets}
    return edges


def _layer(module: str) -> int | None:
    """Index of the module's layer in LAYERS (0 is the top), or None outside them."""
    for i, layer in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in (x.strip() for x in layer.split("|"))):
            return i
    return None


def upward(edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The edges that import a module of a higher layer than the importer's."""
    out = []
    for a, b in sorted(edges):
        la, lb = _layer(a), _layer(b)
        if la is not None and lb is not None and lb < la:
            out.append((a, b))
    return out


def _entry_point_groups() -> dict[str, list[str]]:
    groups = PYPROJECT.get("project", {}).get("entry-points", {})
    return {g: [t.split(":")[0].strip() for t in eps.values()] for g, eps in groups.items()}


def test_hidden_import_finder_finds_upward_imports() -> None:
    # the old way the planner reached the simulator (an entry point loaded below it), and a lazy upward import
    modules = {"plans.plan_json", "scheduler.sim.sustain", "scheduler.sim.replan", "planner.entry", "poolpipe.cli",
               "planner.cli.plan_cli"}
    loader = "from importlib.metadata import entry_points\nGROUP = 'poolpipe.evaluators'\n"
    edges = hidden_imports("plans.plan_json", loader, modules, {"poolpipe.evaluators": ["scheduler.sim.sustain"]})
    assert upward(edges) == [("plans.plan_json", "scheduler.sim.sustain")]
    lazy = "import importlib\ndef f():\n    return importlib.import_module('planner.entry')\n"
    assert upward(hidden_imports("scheduler.sim.replan", lazy, modules, {})) == [
        ("scheduler.sim.replan", "planner.entry")]
    down = "import importlib\nimportlib.import_module('planner.cli.plan_cli')\n"
    assert upward(hidden_imports("poolpipe.cli", down, modules, {})) == []


def test_no_upward_or_cyclic_hidden_import() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    groups = _entry_point_groups()
    edges: set[tuple[str, str]] = set()
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            edges |= hidden_imports(_module_of(path), path.read_text(), graph.modules, groups)
    assert ("poolpipe.cli", "scheduler.server.serve_cli") in edges  # the finder sees the CLI's subcommands
    bad = upward(edges)
    assert not bad, f"imports that go up the layers where import-linter cannot see them: {bad}"
    for a, b in edges:
        graph.add_import(importer=a, imported=b)
    cycles = [_cycle_in(graph, c) for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles through entry points or dynamic imports:\n" + "\n".join(
        " -> ".join(c) for c in cycles)
