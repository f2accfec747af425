"""No import cycles inside skyward/, counting the imports inside functions.

The graph: one node per module of the package (``skyward/x/__init__.py`` is ``skyward.x``),
one edge per import anywhere in the module: at module level (including inside a top-level
``if``/``try``/``with`` and under ``if TYPE_CHECKING:``, never run but a dependency all the
same) and inside functions. A lazy import does not fail at runtime, but a loop it closes is a
loop all the same: the two modules can only be understood, tested and changed together. A
lazy import stays a good way to keep a heavy dependency off ``import skyward``; it is no way
to hide a cycle. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
else to ``pkg``. The implicit import of a parent package is left out: every module would
otherwise sit on a cycle through ``skyward``.

``python -m tests.test_imports`` prints the graph's cycles, each edge of them marked eager or
lazy.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "skyward"


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _top_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            out += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _top_level(node.body)
            for handler in node.handlers:
                out += _top_level(handler.body)
            out += _top_level(node.orelse) + _top_level(node.finalbody)
        elif isinstance(node, ast.With):
            out += _top_level(node.body)
    return out


def _lazy(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports inside functions (anywhere below a def)."""
    out: list[ast.Import | ast.ImportFrom] = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return out


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.add(sub)
        elif base in known:
            out.add(base)
    return out


def import_graph(lazy: bool | None = None) -> dict[str, set[str]]:
    """module -> the skyward modules it imports: anywhere (``lazy=None``), at import time only
    (``False``) or inside functions only (``True``)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        if lazy is None:
            nodes = _top_level(tree.body) + _lazy(tree)
        else:
            nodes = _lazy(tree) if lazy else _top_level(tree.body)
        is_package = path.name == "__init__.py"
        graph[name] = set().union(*(_targets(name, is_package, n, known) for n in nodes)) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "skyward.worker.agent" in graph and "skyward.protocol" in graph
    assert "skyward.protocol" in graph["skyward.pool.connection"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_counts_imports_inside_functions() -> None:
    # skyward.clusters.session imports skyward.pool.lifecycle only inside a function, if at all;
    # a planted module shows both kinds apart
    tree = ast.parse("import skyward.errors\ndef f():\n    import skyward.events\n")
    assert [n.names[0].name for n in _top_level(tree.body)] == ["skyward.errors"]
    assert [n.names[0].name for n in _lazy(tree)] == ["skyward.events"]
    assert "skyward.clusters.session" in import_graph(lazy=True)["skyward"]
    assert "skyward.clusters.session" not in import_graph(lazy=False)["skyward"]


def test_skyward_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


#: The package's units, top layer first (docs/architecture.md draws the same): a unit is a
#: folder of skyward/ or a module at its top (``skyward`` is the public face, __init__.py).
#: A unit imports only units of lower layers, at module level or inside functions; so no two
#: folders import each other, and nothing imports the public face or the command line.
TIERS: list[set[str]] = [
    {"skyward", "cli", "testing"},
    {"dashboard"},
    {"jobs"},
    {"launch"},
    {"clusters"},
    {"torch"},
    {"pool", "integrations", "worker"},
    {"console", "plugins", "providers", "bootstrap", "_shell", "_ship"},
    {"transport", "image", "messages", "accelerators"},
    {"runtime", "_image_fields"},
    {"compute", "_config", "_secrets"},
    {"protocol", "_optional", "job_errors"},
    {"errors", "events", "machine", "_version", "_files", "_procs", "_retry", "_signals", "_home", "_features"},
]
RANK = {unit: tier for tier, units in enumerate(TIERS) for unit in units}
#: The worker's side: imported by nothing but itself (``python -m skyward.worker`` is its door).
#: What the client and the worker both need lives lower: runtime/, protocol/, messages.
WORKER = "worker"


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def climbs(graph: dict[str, set[str]]) -> list[str]:
    """Every import that does not go down the layers, or reaches the worker from outside it."""
    found = []
    for module, targets in graph.items():
        for target in targets:
            here, there = unit(module), unit(target)
            if here == there:
                continue
            if there == WORKER:
                found.append(f"{module} -> {target} (the worker's side)")
            elif RANK[here] >= RANK[there]:
                found.append(f"{module} -> {target}")
    return sorted(found)


def test_every_unit_has_a_layer() -> None:
    units = {unit(m) for m in import_graph()}
    assert sorted(units - set(RANK)) == []


def test_no_import_runs_up_a_layer() -> None:
    assert climbs(import_graph()) == []


def test_the_layer_check_catches_a_climb_and_the_worker() -> None:
    assert climbs({"skyward.pool.pool": {"skyward.clusters.session"}}) == [
        "skyward.pool.pool -> skyward.clusters.session"]
    assert climbs({"skyward.clusters.nodes": {"skyward.worker.resident"}}) == [
        "skyward.clusters.nodes -> skyward.worker.resident (the worker's side)"]
    assert climbs({"skyward.launch.run": {"skyward"}}) == ["skyward.launch.run -> skyward"]
    assert climbs({"skyward.worker.agent": {"skyward.worker.keeper", "skyward.runtime"}}) == []


def test_no_two_units_import_each_other() -> None:
    graph = import_graph()
    pairs = {(unit(m), unit(t)) for m, targets in graph.items() for t in targets if unit(m) != unit(t)}
    assert sorted(f"{a} <-> {b}" for a, b in pairs if (b, a) in pairs and a < b) == []


def test_the_architecture_page_names_every_folder() -> None:
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    folders = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())
    assert [f for f in folders if f"{f}/" not in page] == []


if __name__ == "__main__":
    eager, every = import_graph(lazy=False), import_graph()
    for component in cycles(every):
        print("cycle:", ", ".join(component))
        for module in component:
            for target in sorted(every[module] & set(component)):
                print(f"    {module} -> {target}", "" if target in eager[module] else "(lazy)")
