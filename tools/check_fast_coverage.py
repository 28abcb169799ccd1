"""Lists the package modules whose functions the fast lane never enters.

`make test-fast-coverage` runs the fast lane (`pytest -m fast`) under coverage, then this
script. A module counts as touched when at least one line inside one of its function bodies
ran: a module-level line runs on import alone, so it proves nothing. Modules without any
function (re-exports, constants) have nothing to run and are not listed. Exits 1 when a module
is listed, apart from those in UNMEASURED: code that runs only where coverage cannot follow.
"""

import argparse
import ast
import pathlib
import sys

import coverage

UNMEASURED = {
    # Run by `python -I -S` inside the code sandbox: no site, no environment, so no coverage.
    "scalerl_jax/rewards/_harness.py": "runs only inside the code sandbox",
    "scalerl_jax/rewards/_sandbox_runner.py": "runs only inside the code sandbox",
    "scalerl_jax/rewards/_weak.py": "runs only inside the code sandbox",
    # The reward pool SIGKILLs its children when it closes (a stuck verifier cannot be asked
    # to stop), so they never write their coverage data.
    "scalerl_jax/rewards/pool_child.py": "the reward pool's child, SIGKILLed when the pool closes",
    # Started only by a training run with forecasting on: test_forecast's end-to-end test, too
    # slow for the fast lane.
    "scalerl_jax/scaling/forecast_child.py": "the forecaster's child, started by a training run",
}


def function_lines(path: pathlib.Path) -> set[int]:
    """Line numbers of the statements inside the module's function and method bodies."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in node.body:
                lines.update(n.lineno for n in ast.walk(stmt) if isinstance(n, ast.stmt))
    return lines


def untouched(package: pathlib.Path, data_file: str) -> list[str]:
    data = coverage.CoverageData(basename=data_file)
    data.read()
    executed = {pathlib.Path(f).resolve(): set(data.lines(f) or ()) for f in data.measured_files()}
    out = []
    for path in sorted(package.rglob("*.py")):
        body = function_lines(path)
        if (
            body
            and not body & executed.get(path.resolve(), set())
            and path.as_posix() not in UNMEASURED
        ):
            out.append(str(path))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-file", default=".coverage")
    parser.add_argument("--package", default="scalerl_jax")
    args = parser.parse_args()
    missing = untouched(pathlib.Path(args.package), args.data_file)
    for path in missing:
        print(f"{path}: no function of it ran in the fast lane (pytest -m fast)")
    if missing:
        return 1
    print(
        f"every module of {args.package}/ with functions ran in the fast lane, apart from "
        f"{len(UNMEASURED)} coverage cannot see (tools/check_fast_coverage.py: UNMEASURED)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
