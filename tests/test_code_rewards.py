"""Sandboxed code rewards: test formats, comparison, extraction, limits and isolation layers."""
import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from scalerl_jax.config import ConfigError
from scalerl_jax.rewards import RewardPool
from scalerl_jax.rewards.code import (RUNNER, SandboxLimits, check_tests, extract_code,
                                      outputs_match, parse_tests, run_tests, values_match,
                                      verify_code)

FAST = SandboxLimits(timeout_s=2.0, cpu_s=2.0, memory_mb=512, total_timeout_s=10.0)


def _sandbox_processes():
    """Host pids of processes still running the sandbox runner (every sandboxed process is a
    fork of it, so its command line names the runner)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{name}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if RUNNER.encode() in cmdline and state != "Z":
                found.append(int(name))
    return found


def _no_leftovers():
    deadline = time.monotonic() + 2.0  # SIGKILL is asynchronous: give the kernel a moment
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.02)
    return _sandbox_processes() == []


def _fence(code):
    return f"<think>let me write it</think>Here:\n```python\n{textwrap.dedent(code)}```\n"


STDIO = {"inputs": ["1 2\n", "10 -3\n", "5 5\n"], "outputs": ["3\n", "7", "10\n"]}
CALL = {"fn_name": "pair", "inputs": [[1, 2], [3, 4]], "outputs": [[[1, 2]], [[3, 4]]]}
MBPP = {"test_setup_code": "import math", "test_list": ["assert sq(2) == 4", "assert sq(3) == 9",
                                                        "assert math.isclose(sq(0.5), 0.25)"]}
HUMANEVAL = {"entry_point": "add",
             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
                     "    assert candidate(-1, 1) == 0\n"}

PROGRAMS = {  # format -> (spec, correct, wrong, crashing)
    "stdio": (STDIO, "a, b = map(int, input().split())\nprint(a + b)\n",
              "a, b = map(int, input().split())\nprint(a - b)\n",
              "import sys\nsys.exit(int(input().split()[0]))\n"),
    "stdio_buffer": (STDIO, "import sys\na, b = map(int, sys.stdin.buffer.read().split())\n"
                            "sys.stdout.write(f'{a + b}\\n')\n",
                     "print(open(0).read().split()[0])\n", "raise ValueError('boom')\n"),
    "call": (CALL, "def pair(a, b):\n    return (a, b)\n", "def pair(a, b):\n    return [b, a]\n",
             "def pair(a, b):\n    return a / 0\n"),
    "call_class": (CALL, "class Solution:\n    def pair(self, a, b):\n        return [a, b]\n",
                   "class Solution:\n    def pair(self, a, b):\n        return None\n",
                   "class Solution:\n    pass\n"),
    "mbpp": (MBPP, "def sq(x):\n    return x * x\n", "def sq(x):\n    return x + x\n",
             "def sq(x):\n    return undefined_name\n"),
    "mbpp_list": (MBPP["test_list"][:2], "sq = lambda x: x ** 2\n", "sq = lambda x: 4\n",
                  "sq = lambda x: [][x]\n"),
    "humaneval": (HUMANEVAL, "def add(a, b):\n    return a + b\n",
                  "def add(a, b):\n    return a * b\n", "def add(a, b):\n    raise KeyError\n"),
}


@pytest.mark.parametrize("fmt", sorted(PROGRAMS))
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
    code = ("x = int(input())\nif x == 2:\n    while True: pass\n"
            "if x == 3:\n    raise SystemExit(3)\nprint(x * 10)\n")
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
    assert values_match([1, 2.0000000001, {"a": "x"}], [1, 2, {"a": "x"}])
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


@pytest.mark.parametrize("spec, field", [
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
])
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
        "stdio", ("1\n2\n",), ("3\n",))
    humaneval = parse_tests(HUMANEVAL)
    assert humaneval.mode == "assert" and humaneval.inputs[0].endswith("check(add)\n")
    mbpp = parse_tests(dict(MBPP, test_imports=["import re"]))
    assert len(mbpp.inputs) == 3 and "import re" in mbpp.setup and "import math" in mbpp.setup


def test_check_tests_rejects_bad_json():
    with pytest.raises(ValueError, match="invalid JSON"):
        check_tests("{inputs: ")


@pytest.mark.parametrize("field, value, match", [
    ("timeout_s", 0, "timeout_s=0"), ("cpu_s", float("inf"), "cpu_s=inf"),
    ("memory_mb", 8, "memory_mb=8"), ("max_output_bytes", 1.5, "max_output_bytes=1.5"),
    ("max_processes", 0, "max_processes=0"), ("max_open_files", 3, "max_open_files=3"),
    ("total_timeout_s", -1, "total_timeout_s=-1"), ("namespaces", "yes", "namespaces='yes'"),
    ("audit_hook", 1, "audit_hook=1"), ("max_file_bytes", True, "max_file_bytes=True"),
])
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
    start = time.monotonic()
    result = run_tests(code, ONE, SandboxLimits(timeout_s=0.5, cpu_s=5, total_timeout_s=10))
    assert time.monotonic() - start < 3.0
    assert result.counts == {"timeout": 1}, result
    sandbox = result.outcomes[0].output.strip()
    assert os.path.basename(sandbox).startswith("scalerl-sandbox-")
    assert not os.path.exists(sandbox)  # the sandbox directory is removed afterwards
    assert _no_leftovers()


def test_cpu_limit_counts_as_timeout():
    code = "while True:\n    pass\n"
    result = run_tests(code, ONE, SandboxLimits(timeout_s=5.0, cpu_s=1, total_timeout_s=10))
    assert result.counts == {"timeout": 1} and "cpu" in result.outcomes[0].detail, result


@pytest.mark.parametrize("namespaces", ["auto", "off"])
def test_total_timeout_bounds_the_program(namespaces):
    spec = {"inputs": [""] * 5, "outputs": ["x"] * 5}
    start = time.monotonic()
    result = run_tests("import time\ntime.sleep(0.4)\nprint('x')", spec,
                       SandboxLimits(timeout_s=1.0, total_timeout_s=1.0,
                                     namespaces=namespaces))
    assert time.monotonic() - start < 2.5
    assert result.counts.get("timeout", 0) >= 2 and result.passed <= 3, result
    assert _no_leftovers()


def _namespaces_or_skip():
    try:
        return run_tests("print('done')", ONE, SandboxLimits(namespaces="require"))
    except RuntimeError as e:
        pytest.skip(f"this host does not allow unshare(2) network/PID namespaces: {e}")


def test_escaped_processes_die_with_the_pid_namespace():
    _namespaces_or_skip()
    code = ("import os, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    while True: time.sleep(0.01)\n"
            "print('done', flush=True)\nwhile True: pass\n")
    result = run_tests(code, ONE, SandboxLimits(timeout_s=0.5, audit_hook=False,
                                                namespaces="require"))
    assert result.counts == {"timeout": 1}, result
    assert _no_leftovers()


def test_fork_bomb_is_blocked_by_the_audit_hook():
    # bounded (2**6 processes) so that a broken hook cannot hurt the machine running the tests
    code = "import os\nfor _ in range(6):\n    os.fork()\nwhile True:\n    pass\n"
    result = run_tests(code, ONE, SandboxLimits(timeout_s=2.0, namespaces="off"))
    assert result.counts == {"blocked": 1} and "fork" in result.outcomes[0].detail, result
    assert _no_leftovers()


def test_process_count_limit_without_the_hook():
    """The rlimit layer alone: at most `max_processes` extra processes. Bounded at 48 attempts
    so that the test is harmless where the limit cannot bind."""
    code = ("import os, time\nn = 0\nfor _ in range(48):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n"
            "        os._exit(0)\n    n += 1\nprint(n)\n")
    result = run_tests(code, ONE, SandboxLimits(timeout_s=3.0, max_processes=4,
                                                audit_hook=False))
    assert _no_leftovers()
    forked = int(result.outcomes[0].output)
    if not result.isolation["dropped_root"] and not _nproc_binds():
        pytest.skip("RLIMIT_NPROC does not bind this user (root, possibly seen through a user "
                    "namespace) and the runner could not drop to nobody")
    assert forked <= 4, result


def _nproc_binds():
    """Whether RLIMIT_NPROC limits this user: with it at 1, can a process still fork?"""
    probe = ("import os, resource\nresource.setrlimit(resource.RLIMIT_NPROC, (1, 1))\n"
             "try:\n    pid = os.fork()\nexcept OSError:\n    print('bound')\nelse:\n"
             "    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n    print('free')\n")
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True,
                         timeout=30).stdout
    return out.strip() == "bound"


@pytest.mark.parametrize("code", [
    "x = bytearray(4 * 1024 ** 3)\n",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n",
])
def test_memory_hog_is_a_memory_error(code):
    result = run_tests(code, {"inputs": ["", ""], "outputs": ["x", "x"]},
                       SandboxLimits(memory_mb=256, timeout_s=5.0))
    assert result.counts == {"memory": 2}, result


def _server():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.3)
    return server


def _connect_program(port):
    return (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "print('done')\n")


def _accepted(server):
    try:
        server.accept()[0].close()
        return True
    except socket.timeout:
        return False


@pytest.mark.parametrize("layer", ["audit_hook", "namespaces"])
def test_network_is_blocked(layer):
    if layer == "namespaces":
        _namespaces_or_skip()
    limits = (SandboxLimits(namespaces="off") if layer == "audit_hook" else
              SandboxLimits(namespaces="require", audit_hook=False))
    with _server() as server:
        control = _connect_program(server.getsockname()[1])
        result = run_tests(control, ONE, limits)
        assert result.passed == 0, result
        assert result.counts == ({"blocked": 1} if layer == "audit_hook" else {"crash": 1})
        assert not _accepted(server)
        # the server works: the same connection from this process is accepted
        socket.create_connection(server.getsockname(), timeout=1).close()
        assert _accepted(server)


@pytest.mark.parametrize("layer", ["audit_hook", "privilege_drop"])
def test_cannot_write_outside_the_sandbox(tmp_path, layer):
    target = tmp_path / "escaped.txt"
    code = (f"open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
            f"open({str(target)!r}, 'w').write('x')\nprint('done')\n")
    limits = (SandboxLimits(namespaces="off") if layer == "audit_hook" else
              SandboxLimits(audit_hook=False))
    result = run_tests(code, ONE, limits)
    if layer == "privilege_drop" and not result.isolation["dropped_root"]:
        reason = ("not running as root" if os.geteuid() != 0 else
                  "the Python installation is private to root, so the runner keeps root")
        pytest.skip(f"no privilege drop here: {reason}")
    assert result.passed == 0, result
    assert result.counts == ({"blocked": 1} if layer == "audit_hook" else {"crash": 1}), result
    assert result.outcomes[0].output.startswith("ok")  # writing inside works
    assert not target.exists()


def test_cannot_read_outside_with_the_hook(tmp_path):
    secret = tmp_path / "answers.txt"
    secret.write_text("42")
    result = run_tests(f"print(open({str(secret)!r}).read())", {"inputs": [""],
                                                                  "outputs": ["42"]}, FAST)
    assert result.counts == {"blocked": 1}, result


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
