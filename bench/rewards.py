"""Math verification: throughput on realistic completions and agreement on the case table, for the
code at git HEAD ("before") and the working tree ("after").

    python bench/rewards.py [--completions 1000] [--workers 2] [--timeout 5] [--ref HEAD]
                            [--repeats 3]

Completions are generated (seeded): a chain of thought of 1-4k characters of arithmetic prose,
ending in a boxed answer (80%), "The answer is ..." (10%) or a bare last line (10%), half right
and half wrong, over every answer category of tests/test_math_verify_cases.py (numbers,
fractions, percent, scientific notation, units, text, multiple choice, sets, tuples, intervals,
unions, inequalities, matrices, named values, expressions).

"before" is REF's scalerl_jax/rewards/{math*,sympy_safe}.py (`git show`) imported as a separate
package. A REF whose math-verify fallback was optional (2137265 up to 2da03a2, e.g. --ref
2da03a2~1) gives two rows: as shipped (math-verify is installed now, so the fallback runs) and
with it off (the default install at REF). Rows:

* verifications/s inline (one thread, per CPU-second), and through RewardPool with --workers
  threads and --workers processes (wall clock, best of --repeats passes), after a first pass
  that warms imports, math-verify's parser and SymPy's cache; the process pool's cold pass;
* child start-up: RewardPool(processes=True) construction (spawn) and the first item of each
  child (import of sympy + math_verify, math-verify's lazily loaded parser), paid once per
  worker, against a second item;
* agreement and false positives on the case table, each case through a process pool with a
  --timeout s limit (a timeout scores as incorrect and is counted): at REF math-verify
  computes 9^{9^{9^{9}}} for ever.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import re
import subprocess
import sys
import shutil
import time

from scalerl_jax.rewards import RewardPool
from scalerl_jax.rewards.math import verify_math

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (reference, right answers, wrong answers): the answer text a model writes.
CATEGORIES = [
    ("42", ["42", "42.0", "x = 42"], ["24", "41", "4.2"]),
    ("\\frac{3}{4}", ["\\dfrac{3}{4}", "0.75", "3/4"], ["\\frac{4}{3}", "0.7", "\\frac{3}{5}"]),
    ("2\\sqrt{3}", ["\\sqrt{12}", "2 \\sqrt 3"], ["3\\sqrt{2}", "\\sqrt{6}"]),
    ("\\frac{\\pi}{3}", ["\\pi/3", "\\frac{1}{3}\\pi"], ["\\frac{\\pi}{6}", "60"]),
    ("12\\%", ["12\\%", "0.12"], ["21\\%", "0.012"]),
    ("1.5 \\times 10^{3}", ["1500", "1.5 \\cdot 10^3"], ["150", "1.5 \\times 10^{4}"]),
    ("1000000", ["1,000,000", "10^6"], ["100000", "1,000,001"]),
    ("15", ["15\\text{ cm}", "15 \\text{ meters}"], ["16\\text{ cm}"]),
    ("90^\\circ", ["90", "90^{\\circ}"], ["45^\\circ", "180"]),
    ("\\text{Evelyn}", ["\\text{Evelyn}", "\\text{evelyn}"], ["\\text{Emily}"]),
    ("B", ["(B)", "\\text{(B)}", "B"], ["(C)", "A"]),
    ("\\{1, 2, 3\\}", ["\\{3, 1, 2\\}", "1, 2, 3"], ["\\{1, 2\\}", "(1, 2, 3)"]),
    ("(1, -2)", ["(1, -2)", "\\left(1,-2\\right)"], ["(-2, 1)", "[1, -2]", "\\{1, -2\\}"]),
    ("[2, 5)", ["[2, 5)", "x \\in [2,5)"], ["[2, 5]", "(2, 5)"]),
    (
        "(-\\infty, 1) \\cup (3, \\infty)",
        ["(3,\\infty)\\cup(-\\infty,1)"],
        ["(-\\infty, 1] \\cup (3, \\infty)", "(1, 3)"],
    ),
    ("x \\le 4", ["x \\leq 4", "4 \\ge x"], ["x < 4", "x \\ge 4"]),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 0 & 1 \\end{pmatrix}",
        ["\\begin{bmatrix}1&2\\\\0&1\\end{bmatrix}"],
        ["\\begin{pmatrix}1&0\\\\2&1\\end{pmatrix}"],
    ),
    ("a_3 = 2, a_{37} = 19", ["a_{37} = 19, a_3 = 2"], ["a_3 = 19, a_{37} = 2"]),
    ("x^2 + 2x + 1", ["(x+1)^2", "1 + 2x + x^2"], ["(x-1)^2", "x^2 + 1"]),
    ("\\frac{1+\\sqrt{5}}{2}", ["\\frac{\\sqrt{5}+1}{2}"], ["\\frac{1-\\sqrt{5}}{2}", "2"]),
]

_SENTENCES = [
    "We first compute {a} + {b} = {s}.",
    "Multiplying, {a} \\cdot {b} = {p}.",
    "Let $x_{{{a}}}$ denote the {b}-th term, so the recurrence gives {s}.",
    "Checking the case $n = {a}$: the remainder is {r}.",
    "Hmm, wait. That is not right; {a} - {b} should be {d}.",
    "So far the partial sum is $\\frac{{{a}}}{{{b}}}$, which simplifies further.",
]


def _thought(rng: random.Random) -> str:
    parts, size = [], rng.randint(1000, 4000)
    while sum(map(len, parts)) < size:
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        parts.append(rng.choice(_SENTENCES).format(a=a, b=b, s=a + b, p=a * b, r=a % b, d=a - b))
    return " ".join(parts)


def make_completions(n: int, seed: int = 0) -> list[tuple[str, str, bool]]:
    """(completion, reference, intended verdict), half right and half wrong."""
    rng, out = random.Random(seed), []
    for i in range(n):
        gold, right, wrong = CATEGORIES[i % len(CATEGORIES)]
        correct = i % 2 == 0
        answer = rng.choice(right if correct else wrong)
        style = rng.random()
        if style < 0.8:
            end = f"Therefore, the final answer is $\\boxed{{{answer}}}$."
        elif style < 0.9:
            end = f"The answer is ${answer}$."
        else:
            end = f"Putting everything together:\n${answer}$"
        out.append(
            (f"<think>{_thought(rng)}</think>\n{_thought(rng)[:400]}\n\n{end}", gold, correct)
        )
    return out


# REF's copies: bench/out/rewards_ref/PACKAGE, imported as `out.rewards_ref.PACKAGE` from this
# script's folder (sys.path[0]), as the process pool's spawned children do with this sys.path.
REF_DIR, REF_MODULE = os.path.join(ROOT, "bench", "out", "rewards_ref"), "out.rewards_ref"
# The optional fallback's import in math.py, from 2137265 until 2da03a2 made math-verify a
# dependency (f4a83ec then dropped the fallback).
OPTIONAL_MV = "import math_verify  # optional: pip install math-verify"


def ref_sources(ref: str) -> dict[str, str]:
    """{module name: source} of REF's math verifier: scalerl_jax/rewards/{math*,sympy_safe}.py
    (one math.py before it was split along its seams, several after)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"rewards.py: error: --ref {ref}: {done.stderr.strip()}")
        return done.stdout

    files = git("ls-tree", "--name-only", f"{ref}:scalerl_jax/rewards").split()
    names = [f[:-3] for f in files if re.fullmatch(r"(math\w*|sympy_safe)\.py", f)]
    if "math" not in names:
        sys.exit(f"rewards.py: error: --ref {ref} has no scalerl_jax/rewards/math.py")
    return {n: git("show", f"{ref}:scalerl_jax/rewards/{n}.py") for n in names}


def load_before(sources: dict[str, str], package: str, fallback: bool = True):
    """REF's math verifier (`ref_sources`) as package `package` under REF_DIR, importing its
    own modules; fallback=False turns the optional math-verify fallback off."""
    pkg = os.path.join(REF_DIR, package)
    shutil.rmtree(pkg, ignore_errors=True)
    os.makedirs(pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    own = re.compile(rf"\bscalerl_jax\.rewards\.({'|'.join(sources)})\b")
    for name, text in sources.items():
        text = own.sub(rf"{REF_MODULE}.{package}.\1", text)
        if not fallback:
            text = text.replace(OPTIONAL_MV, "raise ImportError")
        with open(os.path.join(pkg, f"{name}.py"), "w") as f:
            f.write(text)
    importlib.invalidate_caches()  # files written after the import system listed the folder
    return importlib.import_module(f"{REF_MODULE}.{package}.math")


def before_verifiers(ref: str) -> dict:
    """{row name: REF's verify_math}: one row, or two where REF's math-verify fallback was
    optional (off: the default install at REF; on: as shipped, math-verify being installed)."""
    sources = ref_sources(ref)
    if OPTIONAL_MV not in sources["math"]:
        return {ref: load_before(sources, "before").verify_math}
    return {
        f"{ref} (no math-verify)": load_before(sources, "before_plain", False).verify_math,
        f"{ref} (+ math-verify)": load_before(sources, "before_mv").verify_math,
    }


def throughput(verifier, items, workers: int, timeout: float, repeats: int) -> dict:
    """Verifications/s after a first pass over `items` that warms imports, math-verify's parser
    and SymPy's cache (in this process or the pool's children). Inline: per CPU-second of this
    process (other jobs on a shared machine barely move it). Pools: wall clock, the best of
    `repeats` passes; also the process pool's cold first pass."""
    out = {}
    for c, r in items:
        verifier(c, r)
    t0 = time.process_time()
    for c, r in items:
        verifier(c, r)
    out["inline"] = len(items) / (time.process_time() - t0)
    for mode, processes in (("threads", False), ("processes", True)):
        with RewardPool(workers, timeout, processes=processes) as pool:
            cold = pool.score(verifier, items)
            runs = [pool.score(verifier, items) for _ in range(repeats)]
        out[mode] = len(items) / min(r.seconds for r in runs)
        out[mode + "_cold"] = len(items) / cold.seconds
        out[mode + "_timeouts"] = sum(r.num_timeouts for r in runs) + cold.num_timeouts
    return out


def agreement(verifier, cases, workers: int, timeout: float) -> dict:
    with RewardPool(workers, timeout, processes=True) as pool:
        pool.score(verifier, [(c, g) for g, c, _ in cases[:40]])  # warm-up
        res = pool.score(verifier, [(c, g) for g, c, _ in cases])
    expected = [e for *_, e in cases]
    got = res.correct.tolist()
    return {
        "agreement": sum(a == b for a, b in zip(got, expected)) / len(cases),
        "false_positives": sum(a and not b for a, b in zip(got, expected)),
        "missed": sum(b and not a for a, b in zip(got, expected)),
        "timeouts": res.num_timeouts,
        "seconds": res.seconds,
    }


_STARTUP = """
import time
from scalerl_jax.rewards.pool import RewardPool
from scalerl_jax.rewards.math import verify_math
t0 = time.perf_counter()
pool = RewardPool({workers}, 60.0, processes=True)
t1 = time.perf_counter()
item = ("\\\\boxed{{\\\\binom{{10}}{{3}}}}", "120")  # parsed by our own grammar
first = pool.score(verify_math, [item] * {workers}).seconds
second = pool.score(verify_math, [item] * {workers}).seconds
pool.close()
print(f"spawn {{t1 - t0:.2f}} s, first item {{first:.2f}} s, second item {{second * 1000:.1f}} ms")
"""


def startup(workers: int) -> str:
    """Child start-up as in a run whose entry point imports nothing heavy (`python -c`: spawned
    children re-import a script's main module, which would hide the verifier's import)."""
    return subprocess.run(
        [sys.executable, "-c", _STARTUP.format(workers=workers)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def load_test(name: str):
    """tests/NAME.py, imported by its path (tests/ is not a package) and registered as NAME."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tests", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--completions", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--ref", default="HEAD")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    load_test("test_rewards")  # the case table imports a helper from it by name
    cases = load_test("test_math_verify_cases").CASES
    items = make_completions(args.completions)
    pairs = [(c, r) for c, r, _ in items]

    verifiers = {**before_verifiers(args.ref), "after": verify_math}
    mean_chars = sum(len(c) for c, _ in pairs) / len(pairs)
    print(
        f"{len(items)} completions, mean {mean_chars:.0f} chars; case table {len(cases)} "
        f"cases; {args.workers} workers, timeout {args.timeout} s"
    )
    print(f"child start-up (after, {args.workers} workers): {startup(args.workers)}")
    for name, fn in verifiers.items():
        intended = sum(fn(c, r) == ok for c, r, ok in items[:200]) / min(len(items), 200)
        tp = throughput(fn, pairs, args.workers, args.timeout, args.repeats)
        ag = agreement(fn, cases, args.workers, args.timeout)
        print(
            f"{name:28s} verif/s inline {tp['inline']:7.1f}  threads {tp['threads']:7.1f}"
            f"  processes {tp['processes']:7.1f} (cold {tp['processes_cold']:6.1f}, "
            f"timeouts {tp['processes_timeouts']}) | intended verdict on generated "
            f"{intended:.3f} | table agreement {ag['agreement']:.3f}, false positives "
            f"{ag['false_positives']}, missed {ag['missed']}, timeouts {ag['timeouts']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
