"""Code rewards: run a candidate program against its tests in a sandbox and score it.

Test formats (`parse_tests`): stdin/stdout pairs, call-based, MBPP asserts and HumanEval. The
program runs in its own sandboxed process and only plain data comes out; this module compares
it with the expected outputs (`outputs_match`, `values_match`), which never enter the sandbox,
and assert-based tests run in a separate sandboxed harness. Every step here has a deadline and
a cost linear in capped input. Formats, who decides a pass and the comparison rules:
docs/rewards.md, "Code rewards".
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from typing import Any, Optional, Union

from scalerl_jax.config import ConfigError
from scalerl_jax.rewards import _inside
from scalerl_jax.rewards.code_compare import call_match, outputs_match
from scalerl_jax.rewards.math_extract import strip_thinking
from scalerl_jax.rewards.sandbox import ISOLATIONS, HARNESS, RUNNER, Process, resolve_mode

STATUSES = ("ok", "wrong", "timeout", "crash", "memory", "blocked", "skipped")
MAX_CODE_CHARS = 100_000  # a longer program is not run (completions have no length cap)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed program. Per test: `timeout_s` wall clock, `cpu_s` CPU
    (rounded up to whole seconds), `memory_mb` address space, `max_output_bytes` of stdout (or of
    the encoded return value), `max_processes` extra processes/threads, `max_file_bytes` per
    written file, `max_open_files`. Per program: `total_timeout_s` for all its tests, `tmpfs_mb`
    for all its files (bubblewrap mode). `isolation`: "strong" (bubblewrap; refuse to run code
    without it), "best" (bubblewrap where the host has it, else the weak mode: an explicit
    acceptance of the weaker layers), "weak" (always the weak mode); see rewards/sandbox.py."""

    timeout_s: float = 4.0
    cpu_s: float = 4.0
    memory_mb: int = 1024
    max_output_bytes: int = 1 << 20
    max_processes: int = 8
    max_file_bytes: int = 16 << 20
    max_open_files: int = 64
    total_timeout_s: float = 8.0  # below RewardConfig.timeout_s (10 s)
    tmpfs_mb: int = 64
    isolation: str = "strong"

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "total_timeout_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (value > 0 and math.isfinite(value))
            ):
                raise ConfigError(f"SandboxLimits.{name}={value!r}: must be a finite number > 0")
        minimum = {
            "memory_mb": 32,
            "max_output_bytes": 1,
            "max_processes": 1,
            "max_file_bytes": 1,
            "max_open_files": 16,
            "tmpfs_mb": 1,
        }
        for name, low in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"SandboxLimits.{name}={value!r}: must be an integer >= {low}")
        if self.isolation not in ISOLATIONS:
            raise ConfigError(
                f"SandboxLimits.isolation={self.isolation!r}: must be one of {ISOLATIONS}"
            )


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
    isolation: dict  # the mode and layers the program's process reported (see sandbox.py)
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
    fn_name: str = ""  # "call": the function called; "assert": the only name the program gives
    setup: str = ""  # "assert": trusted source run before each test (imports, HumanEval's prompt)

    __test__ = False


# ----------------------------------------------------------------------------- test specs
def _text(value: Any, field: str, i: int) -> str:
    """A stdin/stdout text: a string, or a list of lines (some TACO rows)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + "\n"
    raise ValueError(
        f"tests.{field}[{i}]: expected a string (or a list of lines), got {type(value).__name__}"
    )


def _strings(value: Any, field: str) -> list:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"tests.{field}: expected a list of strings, got {value!r:.80}")
    return value


def parse_tests(tests: Union[dict, list]) -> TestSpec:
    """Validate one test specification (formats: docs/rewards.md); ValueError names the
    field at fault."""
    if isinstance(tests, list):
        tests = {"test_list": tests}
    if not isinstance(tests, dict):
        raise ValueError(
            f"tests: expected a JSON object or a list of asserts, got {type(tests).__name__}"
        )
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
            raise ValueError(
                f"tests.test: expected source defining check(candidate), got {test!r:.80}"
            )
        if not isinstance(entry, str) or not entry.isidentifier():
            raise ValueError(f"tests.entry_point: expected a function name, got {entry!r:.80}")
        prompt = tests.get("prompt") or ""
        if not isinstance(prompt, str):
            raise ValueError(f"tests.prompt: expected the problem's source, got {prompt!r:.80}")
        return TestSpec("assert", (f"{test}\ncheck({entry})\n",), fn_name=entry, setup=prompt)
    keys = ("inputs", "outputs") if "inputs" in tests else ("input", "output")
    if keys[0] not in tests or keys[1] not in tests:
        raise ValueError(
            f"tests: expected 'inputs'/'outputs', 'test_list' or 'test'/"
            f"'entry_point' keys, got {sorted(tests)[:10]}"
        )
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
        return TestSpec(
            "stdio",
            tuple(_text(v, keys[0], i) for i, v in enumerate(inputs)),
            tuple(_text(v, keys[1], i) for i, v in enumerate(outputs)),
        )
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise ValueError(f"tests.fn_name: expected a function name, got {fn_name!r:.80}")
    for i, args in enumerate(inputs):
        if not isinstance(args, list):
            raise ValueError(
                f"tests.{keys[0]}[{i}]: expected a list of arguments, got {type(args).__name__}"
            )
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


# ----------------------------------------------------------------------------- extraction
_FENCE_LANGS = ("python3", "python", "py", "")
_FENCE_TAG_CHARS = 32  # what may follow an opening ``` on its line: a language tag, spaces


def extract_code(completion: str) -> Optional[str]:
    """The program in a completion: the last ```python (or bare ```) fenced block after any
    `</think>`; an unclosed final fence (truncated output) counts up to the end; without a fence,
    the text after `</think>`. None when the thought never closes, nothing is left, or the
    program is over MAX_CODE_CHARS. One forward scan (a backtracking regex here was quadratic
    in a run of spaces after a fence)."""
    text = strip_thinking(completion)
    if text is None:
        return None
    code, start, pos = None, None, 0
    while (j := text.find("```", pos)) >= 0:
        if start is not None:  # inside a block: this closes it
            code, start, pos = text[start:j], None, j + 3
            continue
        newline = text.find("\n", j + 3, j + 3 + _FENCE_TAG_CHARS + 1)
        if newline >= 0 and text[j + 3 : newline].strip(" \t").lower() in _FENCE_LANGS:
            start = pos = newline + 1
        else:
            pos = j + 3
    if start is not None:
        code = text[start:]
    elif code is None:
        code = text
    if not code.strip() or len(code) > MAX_CODE_CHARS:
        return None
    return code


# ----------------------------------------------------------------------------- running
def _decode_value(answer: dict) -> tuple[bool, Any]:
    try:
        return True, _inside.decode(answer.get("value"))
    except (_inside.WireError, RecursionError):
        return False, None


def _short(value: Any, n: int = 300) -> str:
    """A text field of a message from a sandboxed process, capped (anything else: empty)."""
    return value[:n] if type(value) is str else ""


def _outcome(answer: Optional[dict], what: str = "") -> TestOutcome:
    """A TestOutcome for a failed answer of the program's process (None: it did not answer)."""
    if answer is None:
        return TestOutcome(
            "timeout" if what == "timeout" else "crash", what or "the sandbox stopped answering"
        )
    status = _short(answer.get("status"))
    detail = _short(answer.get("detail", answer.get("message", "")))
    if status == "raised":
        return TestOutcome("crash", f"{_short(answer.get('type'))}: {detail}"[:300])
    output = _short(answer.get("stdout", ""), 1 << 20)
    if status == "output":
        return TestOutcome("wrong", detail, output)
    return TestOutcome(status if status in STATUSES else "crash", detail, output)


class _Run:
    """One program's sandboxed process (and harness process, for assert tests) while its tests
    run; the deadlines are enforced here, whatever the processes do."""

    def __init__(self, code: str, spec: TestSpec, limits: SandboxLimits, start: float):
        self.spec, self.limits = spec, limits
        self.deadline = start + limits.total_timeout_s
        mode = resolve_mode(limits.isolation)
        lim = {
            k: getattr(limits, k)
            for k in (
                "timeout_s",
                "cpu_s",
                "memory_mb",
                "max_output_bytes",
                "max_processes",
                "max_file_bytes",
                "max_open_files",
            )
        }
        max_line = 6 * limits.max_output_bytes + 4096  # JSON escaping of the capped output
        tmpfs = limits.tmpfs_mb << 20
        self.harness = None
        self.program = Process(
            RUNNER, mode, {"code": code, "limits": lim}, tmpfs, max_line, self.deadline
        )
        if spec.mode == "assert":
            job = {"setup": spec.setup, "tests": list(spec.inputs), "entry": spec.fn_name}
            self.harness = Process(HARNESS, mode, job, tmpfs, max_line, self.deadline)
        hello = self.program.read(self.deadline)
        if hello is not None and "fatal" in hello:
            raise RuntimeError(f"the code sandbox could not start: {hello['fatal']}")
        self.isolation = (hello or {}).get("isolation", {})
        if not isinstance(self.isolation, dict):
            self.isolation = {}

    def _test_deadline(self) -> float:
        # the program's process enforces timeout_s itself; this bound holds if it does not
        return min(self.deadline, time.monotonic() + self.limits.timeout_s + 1.0)

    def run(self, i: int) -> TestOutcome:
        spec, deadline = self.spec, self._test_deadline()
        if spec.mode == "stdio":
            answer = self.program.request({"op": "stdio", "stdin": spec.inputs[i]}, deadline)
            if answer is None or answer.get("status") != "ok":
                return self._failed(answer, deadline)
            out = answer.get("stdout", "")
            if type(out) is not str or len(out) > self.limits.max_output_bytes:
                return TestOutcome("wrong", "no stdout, or over max_output_bytes")
            if not outputs_match(out, spec.expected[i]):
                return TestOutcome(
                    "wrong", f"expected {spec.expected[i][:60]!r}, got {out[:60]!r}", out
                )
            return TestOutcome("ok", "", out)
        loaded = self.program.request({"op": "load"}, deadline)
        if loaded is None or loaded.get("status") != "ok":
            return self._failed(loaded, deadline)
        if spec.mode == "call":
            outcome = self._call(i, deadline)
        else:
            # An assert-mode spec started self.harness in __init__.
            outcome = self._assert(self.harness, i, deadline)  # type: ignore[arg-type]
        self.program.request({"op": "unload"}, deadline)
        return outcome

    def _failed(self, answer: Optional[dict], deadline: float) -> TestOutcome:
        return _outcome(
            answer, "timeout" if answer is None and time.monotonic() >= deadline else ""
        )

    def _call(self, i: int, deadline: float) -> TestOutcome:
        try:
            args = _inside.encode(list(self.spec.inputs[i]))
        except _inside.WireError as e:
            return TestOutcome("crash", f"tests.inputs[{i}]: {e}")
        answer = self.program.request(
            {"op": "call", "fn": self.spec.fn_name, "args": args}, deadline
        )
        if answer is None or answer.get("status") != "ok":
            return self._failed(answer, deadline)
        ok, got = _decode_value(answer)
        shown = json.dumps(answer.get("value"))[:200]
        if not ok:
            return TestOutcome("wrong", "unreadable return value", shown)
        try:
            match = call_match(got, self.spec.expected[i])
        except RecursionError:
            match = False
        if not match:
            return TestOutcome(
                "wrong", f"expected {self.spec.expected[i]!r:.60}, got {shown[:60]}", shown
            )
        return TestOutcome("ok", "", shown)

    def _assert(self, harness: Process, i: int, deadline: float) -> TestOutcome:
        """Relay the harness's calls to the program until the harness gives its verdict."""
        msg = harness.request({"run": i}, deadline)
        while msg is not None and "verdict" not in msg:
            if msg.get("op") not in ("call", "names"):
                harness.broken = True
                return TestOutcome("crash", "the test harness sent an unknown message")
            answer = self.program.request(msg, deadline)
            if answer is None:
                return self._failed(answer, deadline)
            msg = harness.request(answer, deadline)
        if msg is None:
            return self._failed(None, deadline)
        status = _short(msg["verdict"])
        return TestOutcome(status if status in STATUSES else "crash", _short(msg.get("detail")))

    @property
    def broken(self) -> bool:
        return any(p is not None and p.broken for p in (self.program, self.harness))

    def close(self) -> None:
        for process in (self.program, self.harness):
            if process is not None:
                process.close()


def run_tests(
    code: str,
    tests: Union[dict, list, TestSpec],
    limits: SandboxLimits = SandboxLimits(),
    *,
    fail_fast: bool = False,
) -> CodeResult:
    """Run `code` against `tests` in the sandbox. Every test gets a status (STATUSES); with
    `fail_fast` the run stops at the first failure and the rest are `skipped`. Raises ValueError
    for a malformed spec, SandboxUnavailable when `limits.isolation="strong"` cannot be met, and
    RuntimeError when the sandbox itself cannot start."""
    spec = tests if isinstance(tests, TestSpec) else parse_tests(tests)
    if not isinstance(code, str):
        raise ValueError(f"code: expected a string, got {type(code).__name__}")
    start = time.monotonic()
    n = len(spec.inputs)
    outcomes: list = [None] * n
    run = None
    try:
        run = _Run(code, spec, limits, start)
        for i in range(n):
            if time.monotonic() >= run.deadline or run.broken:
                break
            outcomes[i] = run.run(i)
            if outcomes[i].status == "timeout" and time.monotonic() >= run.deadline:
                outcomes[i] = TestOutcome(
                    "timeout", f"program over total_timeout_s={limits.total_timeout_s}"
                )
            if outcomes[i].status != "ok" and fail_fast:
                break
    finally:
        if run is not None:
            run.close()
    for i in range(n):
        if outcomes[i] is None:
            outcomes[i] = (
                TestOutcome("skipped", "an earlier test failed")
                if fail_fast
                else TestOutcome("crash", "the sandbox stopped answering")
                if run is not None and run.broken and time.monotonic() < run.deadline
                else TestOutcome(
                    "timeout", f"program over total_timeout_s={limits.total_timeout_s}"
                )
            )
    passed = sum(o.status == "ok" for o in outcomes)
    return CodeResult(
        passed, n, tuple(outcomes), run.isolation if run else {}, time.monotonic() - start
    )


def verify_code(completion: str, reference: str, isolation: str = "strong") -> bool:
    """Reward verifier: True iff the program in `completion` (`extract_code`) passes every test
    of `reference` (a JSON test specification, see `parse_tests`) under the default limits and
    `isolation` (SandboxLimits.isolation). Module-level, so it (or a partial of it) can run in
    RewardPool thread or process workers."""
    spec = parse_tests(json.loads(reference))
    code = extract_code(completion)
    if code is None:
        return False
    return run_tests(code, spec, SandboxLimits(isolation=isolation), fail_fast=True).all_passed
