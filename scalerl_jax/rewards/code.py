"""Code rewards: run a candidate program against its tests in a sandbox and score it.

Test formats (`parse_tests`): stdin/stdout pairs (APPS / TACO / CodeContests,
`{"inputs": [...], "outputs": [...]}`), call-based (`{"fn_name": "f", "inputs": [[args...]],
"outputs": [...]}`), assert-based (MBPP `{"test_list": [...], "test_setup_code": ...}` or a plain
list of asserts; HumanEval `{"test": "def check(candidate): ...", "entry_point": "f"}`).

The program never runs in the trainer's process. `run_tests` starts `_sandbox_runner.py` in a
fresh interpreter (`python -I -S`, own session, minimal environment, a new temporary directory as
cwd and HOME, removed afterwards); the runner forks one child per test. What each layer covers,
and what it does not:

* rlimits per test child: CPU seconds, address space (`memory_mb`), file size, open files,
  processes/threads, no core files; plus a wall-clock timeout per test and per program enforced
  by SIGKILL of the process group, and a parent-death signal so nothing outlives its caller
  (e.g. a reward-pool worker killed on timeout). RLIMIT_NPROC does not bind root: a root runner
  that cannot drop privileges relies on the audit hook and the kills. Without a PID namespace, a
  descendant that leaves its process group (setsid) escapes the kill.
* namespaces (`namespaces="auto"`: where unshare(2) is allowed — as root, or where
  unprivileged user namespaces are enabled; Docker's default seccomp profile and Ubuntu's
  AppArmor restriction forbid it, and then this layer is off): a network
  namespace whose loopback is down, so no connection can be made by any code, native or not;
  a PID namespace, so killing the runner's group kills every descendant. There is no mount
  namespace: the filesystem is the host's.
* privilege drop: a runner started as root becomes nobody, so file permissions refuse writes
  outside the sandbox directory — only when the Python installation is world-readable (a
  pyenv under /root is not; then it stays root). Unprivileged runners keep the trainer's uid.
* audit hook (PEP 578, `audit_hook=True`): refuses sockets and name lookups, process creation
  (fork/exec/spawn/system/Popen), signalling other processes, ctypes calls, writes outside the
  sandbox and reads outside the sandbox, the Python installation and system directories. It
  works where namespaces do not, but only against Python-level calls: native code of an
  installed extension bypasses it, and a program that targets this harness can tamper with the
  hook's state in its own memory.

Verdicts: stdin/stdout output and call-based return values are compared here, outside the
sandbox, and the expected outputs are never sent into it. Assert-based tests must run inside the
candidate's process (as in the original MBPP/HumanEval harnesses); there a program written to
forge the harness's success report could fake a pass.

Comparison (`outputs_match`): whitespace-insensitive token comparison, numbers within 1e-6
(absolute or relative) when either is written with a decimal point or exponent, integers exact.

Hand-written because the available sandboxes either need a service (judge servers, containers)
or a compiled helper (bubblewrap, nsjail, libseccomp); this uses the standard library only.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Optional, Union

from scalerl_jax.config import ConfigError
from scalerl_jax.rewards.math import strip_thinking

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_runner.py")
STATUSES = ("ok", "wrong", "timeout", "crash", "memory", "blocked", "skipped")
FLOAT_TOL = 1e-6


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed program. Per test: `timeout_s` wall clock, `cpu_s` CPU
    (rounded up to whole seconds), `memory_mb` address space, `max_output_bytes` of stdout (or of
    the serialized return value), `max_processes` extra processes/threads, `max_file_bytes` per
    written file, `max_open_files`. Per program: `total_timeout_s` for all its tests.
    `namespaces`: "auto" (use network/PID namespaces where the host allows), "require" (refuse
    to run without them), "off". `audit_hook`: the Python-level fallback layer."""

    timeout_s: float = 4.0
    cpu_s: float = 4.0
    memory_mb: int = 1024
    max_output_bytes: int = 1 << 20
    max_processes: int = 8
    max_file_bytes: int = 16 << 20
    max_open_files: int = 64
    total_timeout_s: float = 8.0  # below RewardConfig.timeout_s (10 s)
    namespaces: str = "auto"
    audit_hook: bool = True

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "total_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    value > 0 and math.isfinite(value)):
                raise ConfigError(f"SandboxLimits.{name}={value!r}: must be a finite number > 0")
        minimum = {"memory_mb": 32, "max_output_bytes": 1, "max_processes": 1,
                   "max_file_bytes": 1, "max_open_files": 16}
        for name, low in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"SandboxLimits.{name}={value!r}: must be an integer >= {low}")
        if self.namespaces not in ("auto", "require", "off"):
            raise ConfigError(f"SandboxLimits.namespaces={self.namespaces!r}: must be one of "
                              "'auto', 'require', 'off'")
        if not isinstance(self.audit_hook, bool):
            raise ConfigError(f"SandboxLimits.audit_hook={self.audit_hook!r}: must be a bool")


@dataclasses.dataclass(frozen=True)
class TestOutcome:
    status: str  # one of STATUSES
    detail: str = ""  # why it failed, short
    output: str = ""  # stdout or the JSON return value, capped at max_output_bytes

    __test__ = False  # not a pytest class


@dataclasses.dataclass(frozen=True)
class CodeResult:
    passed: int
    total: int
    outcomes: tuple  # TestOutcome per test, in order
    isolation: dict  # layers that were active: namespaces, dropped_root, audit_hook
    seconds: float

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def counts(self) -> dict:
        """Number of tests per status, e.g. {"ok": 3, "timeout": 1}."""
        return dict(Counter(o.status for o in self.outcomes))


@dataclasses.dataclass(frozen=True)
class TestSpec:
    """A validated test specification. `mode`: "stdio" (inputs are stdin texts, expected are
    stdout texts), "call" (inputs are argument lists, expected are return values) or "assert"
    (inputs are test sources run after `setup`; expected is empty)."""

    mode: str
    inputs: tuple
    expected: tuple = ()
    fn_name: str = ""
    setup: str = ""

    __test__ = False


# ----------------------------------------------------------------------------- test specs
def _text(value: Any, field: str, i: int) -> str:
    """A stdin/stdout text: a string, or a list of lines (some TACO rows)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + "\n"
    raise ValueError(f"tests.{field}[{i}]: expected a string (or a list of lines), "
                     f"got {type(value).__name__}")


def _strings(value: Any, field: str) -> list:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"tests.{field}: expected a list of strings, got {value!r:.80}")
    return value


def parse_tests(tests: Union[dict, list]) -> TestSpec:
    """Validate one test specification (formats in the module docstring); ValueError names the
    field at fault."""
    if isinstance(tests, list):
        tests = {"test_list": tests}
    if not isinstance(tests, dict):
        raise ValueError(f"tests: expected a JSON object or a list of asserts, "
                         f"got {type(tests).__name__}")
    if "test_list" in tests:
        asserts = [a for a in _strings(tests["test_list"], "test_list") if a.strip()]
        setup = tests.get("test_setup_code") or ""
        if not isinstance(setup, str):
            raise ValueError(f"tests.test_setup_code: expected a string, got {setup!r:.80}")
        imports = tests.get("test_imports") or []
        setup = "\n".join(_strings(imports, "test_imports") + [setup])
        if not asserts:
            raise ValueError("tests.test_list: no tests (0 non-empty asserts)")
        return TestSpec("assert", tuple(asserts), setup=setup)
    if "test" in tests or "entry_point" in tests:
        test, entry = tests.get("test"), tests.get("entry_point")
        if not isinstance(test, str) or "def check" not in test:
            raise ValueError(f"tests.test: expected source defining check(candidate), "
                             f"got {test!r:.80}")
        if not isinstance(entry, str) or not entry.isidentifier():
            raise ValueError(f"tests.entry_point: expected a function name, got {entry!r:.80}")
        return TestSpec("assert", (f"{test}\ncheck({entry})\n",))
    keys = ("inputs", "outputs") if "inputs" in tests else ("input", "output")
    if keys[0] not in tests or keys[1] not in tests:
        raise ValueError(f"tests: expected 'inputs'/'outputs', 'test_list' or 'test'/"
                         f"'entry_point' keys, got {sorted(tests)[:10]}")
    inputs, outputs = tests[keys[0]], tests[keys[1]]
    for field, value in zip(keys, (inputs, outputs)):
        if not isinstance(value, list):
            raise ValueError(f"tests.{field}: expected a list, got {type(value).__name__}")
    if len(inputs) != len(outputs):
        raise ValueError(f"tests: {len(inputs)} {keys[0]} but {len(outputs)} {keys[1]}")
    if not inputs:
        raise ValueError(f"tests.{keys[0]}: no tests (empty list)")
    fn_name = tests.get("fn_name")
    if fn_name is None or fn_name == "":
        return TestSpec("stdio", tuple(_text(v, keys[0], i) for i, v in enumerate(inputs)),
                        tuple(_text(v, keys[1], i) for i, v in enumerate(outputs)))
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise ValueError(f"tests.fn_name: expected a function name, got {fn_name!r:.80}")
    for i, args in enumerate(inputs):
        if not isinstance(args, list):
            raise ValueError(f"tests.{keys[0]}[{i}]: expected a list of arguments, "
                             f"got {type(args).__name__}")
    return TestSpec("call", tuple(inputs), tuple(outputs), fn_name=fn_name)


def check_tests(reference: str) -> None:
    """Raise ValueError when `reference` (a JSON test specification) is malformed; for
    validating data rows at load time."""
    if not isinstance(reference, str):
        raise ValueError(f"tests: expected a JSON string, got {type(reference).__name__}")
    try:
        tests = json.loads(reference)
    except json.JSONDecodeError as e:
        raise ValueError(f"tests: invalid JSON ({e})") from None
    parse_tests(tests)


# ----------------------------------------------------------------------------- comparison
_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _tokens_equal(a: str, b: str) -> bool:
    if a == b:
        return True
    if not (_NUMBER_RE.fullmatch(a) and _NUMBER_RE.fullmatch(b)):
        return False
    if not any(c in s for s in (a, b) for c in ".eE"):
        return int(a) == int(b)  # "007" == "7"; integers never get a tolerance
    x, y = float(a), float(b)
    return math.isclose(x, y, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)


def outputs_match(got: str, expected: str) -> bool:
    """Whitespace-insensitive token comparison; numbers with a decimal point or exponent within
    1e-6 absolute or relative."""
    a, b = got.split(), expected.split()
    return len(a) == len(b) and all(_tokens_equal(x, y) for x, y in zip(a, b))


def values_match(got: Any, expected: Any) -> bool:
    """Return values as JSON data: lists element-wise, floats within 1e-6, bools not numbers."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return got is expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        if isinstance(got, int) and isinstance(expected, int):
            return got == expected
        return math.isclose(got, expected, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(map(values_match, got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k])
                                                     for k in got)
    return type(got) is type(expected) and got == expected


def _call_match(got: Any, expected: Any) -> bool:
    """APPS stores many call-based outputs wrapped in a one-element list: accept either."""
    return values_match(got, expected) or (
        isinstance(expected, list) and len(expected) == 1 and values_match(got, expected[0]))


# ----------------------------------------------------------------------------- extraction
_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_OPEN_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n", re.IGNORECASE)


def extract_code(completion: str) -> Optional[str]:
    """The program in a completion: the last ```python (or bare ```) fenced block after any
    `</think>`; an unclosed final fence (truncated output) counts up to the end; without a fence,
    the text after `</think>`. None when the thought never closes or nothing is left."""
    text = strip_thinking(completion)
    if text is None:
        return None
    blocks = list(_FENCE_RE.finditer(text))
    tail = text[blocks[-1].end():] if blocks else text
    opened = _OPEN_FENCE_RE.search(tail)
    if opened:
        code = tail[opened.end():]
    elif blocks:
        code = blocks[-1].group(1)
    else:
        code = text
    return code if code.strip() else None


# ----------------------------------------------------------------------------- running
# The runner starts with -S (no `site`: its .pth processing is a third of the start-up time) and
# puts these on sys.path itself, so programs can still import installed packages such as numpy.
_SITE_PACKAGES = [p for p in site.getsitepackages() if os.path.isdir(p)]


def _minimal_env(sandbox: str) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": sandbox, "TMPDIR": sandbox, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8"}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the runner's process group, before the runner is reaped (so its id, the group id,
    cannot have been reused)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_tests(code: str, tests: Union[dict, list, TestSpec],
              limits: SandboxLimits = SandboxLimits(), *, fail_fast: bool = False) -> CodeResult:
    """Run `code` against `tests` in the sandbox. Every test gets a status (STATUSES); with
    `fail_fast` the run stops at the first failure and the rest are `skipped`. Raises ValueError
    for a malformed spec and RuntimeError only when the sandbox itself cannot start (or
    `namespaces="require"` cannot be met)."""
    spec = tests if isinstance(tests, TestSpec) else parse_tests(tests)
    if not isinstance(code, str):
        raise ValueError(f"code: expected a string, got {type(code).__name__}")
    start = time.monotonic()
    n = len(spec.inputs)
    outcomes: list = [None] * n
    isolation: dict = {}
    sandbox = tempfile.mkdtemp(prefix="scalerl-sandbox-")
    job = {"code": code, "mode": spec.mode, "tests": list(spec.inputs), "fn_name": spec.fn_name,
           "setup": spec.setup, "sandbox": sandbox, "namespaces": limits.namespaces,
           "audit_hook": limits.audit_hook, "total_timeout_s": limits.total_timeout_s,
           "parent": os.getpid(), "site_packages": _SITE_PACKAGES,
           "limits": {k: getattr(limits, k) for k in (
               "timeout_s", "cpu_s", "memory_mb", "max_output_bytes", "max_processes",
               "max_file_bytes", "max_open_files")}}
    payload = json.dumps(job).encode()
    # Bound on what the runner may send: each record carries at most one capped output (JSON
    # escaping at most doubles UTF-8 text of printable characters; control characters more).
    max_bytes = (n + 1) * (6 * limits.max_output_bytes + 4096)
    proc = None
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", RUNNER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=sandbox,
                                env=_minimal_env(sandbox), start_new_session=True,
                                close_fds=True)
        try:
            proc.stdin.write(payload)  # the runner reads all of it before writing anything
            proc.stdin.close()
        except BrokenPipeError:
            pass
        deadline = start + limits.total_timeout_s
        buf, received, stop, broken = b"", 0, False, False
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not (stop or broken):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    break
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                received += len(chunk)
                if received > max_bytes:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    try:
                        record = json.loads(line)
                    except ValueError:  # only the runner writes here; a broken line ends it
                        broken = True
                        break
                    if "isolation" in record:
                        isolation = record["isolation"]
                        if record.get("fatal"):
                            raise RuntimeError(f"SandboxLimits.namespaces='require' but the "
                                               f"sandbox could not unshare: {record['fatal']}")
                        continue
                    i = record["i"]
                    outcomes[i] = _judge(spec, i, record)
                    if fail_fast and outcomes[i].status != "ok":
                        stop = True
                        break  # later records of the same read are ignored, as if not run
    finally:
        if proc is not None:
            _kill_group(proc)
            proc.wait()
            proc.stdout.close()
        shutil.rmtree(sandbox, ignore_errors=True)
    out_of_time = time.monotonic() - start >= limits.total_timeout_s
    for i in range(n):
        if outcomes[i] is None:
            if stop:
                outcomes[i] = TestOutcome("skipped", "an earlier test failed")
            elif out_of_time:
                outcomes[i] = TestOutcome("timeout", f"program over total_timeout_s="
                                                     f"{limits.total_timeout_s}")
            else:
                outcomes[i] = TestOutcome("crash", "the sandbox ended before this test")
    passed = sum(o.status == "ok" for o in outcomes)
    return CodeResult(passed, n, tuple(outcomes), isolation, time.monotonic() - start)


def _judge(spec: TestSpec, i: int, record: dict) -> TestOutcome:
    status, detail, output = record["status"], record["detail"], record["output"]
    if status == "ok" and spec.mode == "stdio" and not outputs_match(output, spec.expected[i]):
        status, detail = "wrong", f"expected {spec.expected[i][:60]!r}, got {output[:60]!r}"
    elif status == "ok" and spec.mode == "call":
        try:
            got = json.loads(output)
        except (TypeError, ValueError):  # a verdict forged by the program itself
            return TestOutcome("wrong", "unreadable return value", str(output)[:200])
        if not _call_match(got, spec.expected[i]):
            status, detail = "wrong", f"expected {spec.expected[i]!r:.60}, got {output[:60]!r}"
    return TestOutcome(status, detail, output)


def verify_code(completion: str, reference: str) -> bool:
    """Reward verifier: True iff the program in `completion` (`extract_code`) passes every test
    of `reference` (a JSON test specification, see `parse_tests`) under the default limits.
    Module-level, so it can run in RewardPool thread or process workers."""
    spec = parse_tests(json.loads(reference))
    code = extract_code(completion)
    if code is None:
        return False
    return run_tests(code, spec, SandboxLimits(), fail_fast=True).all_passed
