"""The import graph of scalerl_jax and its entry points, checked against a layer order.

    python tools/import_graph.py            # the graph between units, then any violation
    python tools/import_graph.py --modules  # the module-level graph as well

A unit is a subpackage of scalerl_jax (`scalerl_jax.train`), a top-level module
(`scalerl_jax.metrics`), or an entry-point folder (`experiments`, `bench`). Every import counts,
those inside functions included: a deferred import is still a dependency, it only moves its
cost. Imports under `if TYPE_CHECKING:` do not count.

Two checks, both over the whole tree:
* layers: a unit may import units of its own layer or of lower layers (`LAYERS`, highest first);
  an import of a higher layer is an upward edge;
* cycles: no cycle between units, and none between modules. `WHOLE` names modules that are
  treated as one node even when they become packages (their insides are one responsibility),
  so that splitting them changes nothing here.

Exit status 1 when a check fails; `check()` returns the messages for tests.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "scalerl_jax"
ENTRY_DIRS = ("experiments", "bench")

# Highest first. A unit imports only its own layer or lower ones.
LAYERS: tuple[tuple[str, ...], ...] = (
    # entry points: command-line scripts and benchmarks
    ("experiments", "bench"),
    # the command-line programs (experiments/ calls their `main`s)
    ("cli",),
    # what the commands add around a run: the evaluation command, the checks before a run
    ("evaluation", "preflight"),
    # what a run is planned and configured from: the launch planner (which applies the
    # trainer's own rules, train.pipeline.Schedule), the named recipes
    ("plan", "recipes"),
    # the training loop and its parts
    ("train",),
    # what the loop drives: the sampler, the prompts, checkpoints
    ("sampler", "data", "checkpoint"),
    # what those are built on: the model, the verifiers (data reads answers with their rules)
    ("models", "rewards"),
    # math, fits, configuration and small utilities with no knowledge of the parts above
    (
        "errors",
        "rl",
        "scaling",
        "losses",
        "config",
        "mesh",
        "metrics",
        "multihost",
        "heartbeat",
        "interrupt",
        "progress",
        "rundir",
        "tracking",
        "_renamed",
    ),
)

# Modules that are one node whatever their layout (module or package).
WHOLE = (
    "scalerl_jax.config",
    "scalerl_jax.recipes",
    "scalerl_jax.models.hf",
    "scalerl_jax.rewards.math",
)


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[: -len(".py")]
    parts = rel.split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _files() -> Iterator[str]:
    for top in (PACKAGE, *ENTRY_DIRS):
        for folder, dirs, names in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            for name in sorted(names):
                if name.endswith(".py"):
                    yield os.path.join(folder, name)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, list[str]]]:
    """(module, names) of each import statement; relative ones resolved against `module`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            yield base, [alias.name for alias in node.names]
        stack.extend(ast.iter_child_nodes(node))


def module_edges() -> dict[str, set[str]]:
    """{importing module: the modules of this tree it imports}, `WHOLE` collapsed."""
    sources = {}
    for path in _files():
        sources[_module_name(path)] = path
    known = set(sources)

    def resolve(name: str) -> str | None:
        for whole in WHOLE:
            if name == whole or name.startswith(whole + "."):
                return whole
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in sources.items():
        src = resolve(module)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_package = path.endswith("__init__.py")
        for base, names in _imported(tree, module, is_package):
            if not base.startswith(PACKAGE):
                continue
            # `from scalerl_jax.x import y`: y may be a module (an edge to it) or a name in x.
            targets = [f"{base}.{n}" if f"{base}.{n}" in known else base for n in names] or [base]
            for target in targets:
                dst = resolve(target)
                if dst is not None and dst != src:
                    edges[src].add(dst)
        edges.setdefault(src, set())
    return dict(edges)


def unit_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return parts[0]
    return parts[1] if len(parts) > 1 else PACKAGE


def unit_edges(edges: dict[str, set[str]]) -> dict[str, dict[str, set[tuple[str, str]]]]:
    """{unit: {imported unit: {(module, imported module), ...}}}."""
    units: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for src, dsts in edges.items():
        units[unit_of(src)]
        for dst in dsts:
            a, b = unit_of(src), unit_of(dst)
            if a != b and b != PACKAGE:
                units[a][b].add((src, dst))
    return {u: dict(d) for u, d in units.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []

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


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle inside `component` (one of `cycles`), as [a, b, ..., a]."""
    inside = set(component)
    best: list[str] = []
    for start in sorted(component):
        parent: dict[str, str | None] = {start: None}
        queue, last = [start], None
        while queue and last is None:
            v = queue.pop(0)
            for w in sorted(graph.get(v, set()) & inside):
                if w == start:
                    last = v
                    break
                if w not in parent:
                    parent[w] = v
                    queue.append(w)
        if last is None:
            continue
        path = [last]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
        cycle = [*reversed(path), start]
        if not best or len(cycle) < len(best):
            best = cycle
    return best


def layer_of(unit: str) -> int:
    """0 for the highest layer; KeyError for a unit missing from `LAYERS`."""
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise KeyError(unit)


def _edge_list(pairs) -> str:
    return ", ".join(f"{a} -> {b}" for a, b in sorted(pairs))


def check() -> list[str]:
    """Every violation as one line naming its edges; [] when the graph is clean."""
    edges = module_edges()
    units = unit_edges(edges)
    problems = []
    for unit in sorted(units):
        if unit != PACKAGE and not any(unit in layer for layer in LAYERS):
            problems.append(f"unit {unit} has no layer: add it to LAYERS in tools/import_graph.py")
    for unit, dsts in sorted(units.items()):
        for dst, pairs in sorted(dsts.items()):
            try:
                upward = layer_of(dst) < layer_of(unit)
            except KeyError:
                continue
            if upward:
                problems.append(
                    f"upward edge {unit} -> {dst} (layer {layer_of(unit)} imports "
                    f"layer {layer_of(dst)}): {_edge_list(pairs)}"
                )
    unit_graph = {u: set(d) for u, d in units.items()}
    for component in cycles(unit_graph):
        path = shortest_cycle(unit_graph, component)
        pairs = [p for a, b in zip(path, path[1:]) for p in units[a][b]]
        problems.append(
            f"cycle between units {' -> '.join(path)} (of {len(component)} units in "
            f"a cycle): {_edge_list(pairs)}"
        )
    for component in cycles(edges):
        path = shortest_cycle(edges, component)
        problems.append(
            f"cycle between modules {' -> '.join(path)} (of {len(component)} modules in a cycle)"
        )
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="also print the module-level graph")
    args = parser.parse_args(argv)
    edges = module_edges()
    units = unit_edges(edges)
    for layer in LAYERS:
        for unit in layer:
            dsts = sorted(units.get(unit, {}))
            print(f"{unit:12s} -> {', '.join(dsts) if dsts else '-'}")
    if args.modules:
        print()
        for module in sorted(edges):
            print(f"{module} -> {', '.join(sorted(edges[module])) or '-'}")
    problems = check()
    print()
    print("\n".join(problems) if problems else "no upward edge, no cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
