"""The package's import graph: layers respected, no cycle (tools/import_graph.py), and the
child processes' entry points import nothing heavy."""

import os
import subprocess
import sys
from _scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    return load_script("tools/import_graph.py", "import_graph")


def test_no_upward_edge_and_no_cycle():
    problems = _tool().check()
    assert not problems, (
        "tools/import_graph.py (layers, highest first, in its LAYERS):\n" + "\n".join(problems)
    )


def test_the_checker_finds_cycles():
    cycles = _tool().cycles
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _tool().shortest_cycle(graph, ["a", "b", "c", "d"]) == ["a", "d", "a"]


def test_child_entry_points_import_nothing_heavy():
    # A spawned child imports its entry point's module, packages included, before it starts.
    code = (
        "import sys, scalerl_jax.rewards.pool_child, scalerl_jax.scaling.forecast_child; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('scalerl_jax', 'jax', 'numpy', 'sympy', 'math_verify'))))"
    )
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=ROOT
    ).stdout.split()
    assert out == [
        "scalerl_jax",
        "scalerl_jax.errors",  # the package exports UserError; it imports nothing
        "scalerl_jax.rewards",
        "scalerl_jax.rewards.pool_child",
        "scalerl_jax.scaling",
        "scalerl_jax.scaling.forecast_child",
    ], out
