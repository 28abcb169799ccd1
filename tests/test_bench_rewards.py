"""bench/rewards.py's "before": a git ref's math verifier imported as a package of its own (every
module it imports its own copy), with one row per ref, or two where the ref's math-verify
fallback was optional; a ref that is not there is one line. No benchmark is run."""

import os
import subprocess
import sys

import pytest
from _scripts import ROOT, load_script

# A ref's verifier as the bench reads it: math.py importing a sibling, an optional fallback.
FAKE = {
    "math.py": (
        "from scalerl_jax.rewards.math_compare import same\n"
        "try:\n"
        "    import math_verify  # optional: pip install math-verify\n"
        "    FALLBACK = True\n"
        "except ImportError:\n"
        "    FALLBACK = False\n"
        "def verify_math(completion, reference):\n"
        "    return same(completion, reference)\n"
    ),
    "math_compare.py": "def same(a, b):\n    return a == b\n",
    "sympy_safe.py": "",
    "pool.py": "raise AssertionError('not part of the verifier')\n",
}


@pytest.fixture
def bench(monkeypatch, tmp_path):
    """The bench with its copies under tmp_path, as a package named after the test."""
    module = load_script("bench/rewards.py", "rewards_bench")
    name = "ref_" + tmp_path.name
    monkeypatch.setattr(module, "REF_DIR", str(tmp_path / name))
    monkeypatch.setattr(module, "REF_MODULE", name)
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_head_is_one_row_of_its_own_modules(bench):
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    (row, fn), *rest = bench.before_verifiers("HEAD").items()
    assert row == "HEAD" and rest == []
    assert fn.__module__ == f"{bench.REF_MODULE}.before.math"
    copied = [m for m in sys.modules if m.startswith(f"{bench.REF_MODULE}.before.")]
    assert {f"{bench.REF_MODULE}.before.{n}" for n in ("math", "sympy_safe")} <= set(copied)
    for m in copied:  # nothing of the verifier comes from the working tree
        origins = {getattr(v, "__module__", "") for v in vars(sys.modules[m]).values()}
        assert not [o for o in origins if o.startswith("scalerl_jax.rewards")], (m, origins)
    assert fn("so $\\boxed{\\frac{3}{4}}$", "0.75") and not fn("so $\\boxed{4/3}$", "0.75")


def test_an_optional_fallback_gives_two_rows_and_a_missing_ref_one_line(
    bench, tmp_path, monkeypatch
):
    repo = tmp_path / "repo"
    (repo / "scalerl_jax" / "rewards").mkdir(parents=True)
    for name, text in FAKE.items():
        (repo / "scalerl_jax" / "rewards" / name).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    monkeypatch.setattr(bench, "ROOT", str(repo))

    rows = bench.before_verifiers("HEAD")
    assert list(rows) == ["HEAD (no math-verify)", "HEAD (+ math-verify)"]
    plain, with_mv = (sys.modules[fn.__module__] for fn in rows.values())
    assert plain.FALLBACK is False and with_mv.FALLBACK is True  # math-verify is installed
    assert plain.same.__module__ == f"{bench.REF_MODULE}.before_plain.math_compare"
    assert rows["HEAD (no math-verify)"]("1", "1") and not rows["HEAD (+ math-verify)"]("1", "2")
    assert not os.path.exists(os.path.join(bench.REF_DIR, "before_plain", "pool.py"))

    with pytest.raises(SystemExit) as err:
        bench.before_verifiers("nope")
    assert str(err.value).startswith("rewards.py: error: --ref nope: fatal:")
    assert "\n" not in str(err.value)
