"""The trusted harness of assert-based tests (MBPP asserts, HumanEval `check(candidate)`):
`python -I -S _harness.py`, started by `rewards/sandbox.py` in a sandbox of its own; never
imported. Trusted setup code runs first; the candidate's functions are proxies relayed to its
process, answering decoded builtin values; anything that goes wrong on its side is one
`CandidateFailed` (kept in `_FAILURES`, so catching it does not pass a test). Why:
docs/rewards.md, "Who decides a pass".

Protocol, one JSON line each way: stdin gets the job (`setup`, `tests`, `entry`), then
`{"run": i}`; this process answers with `{"op": "names" | "call", ...}` lines (each followed on
stdin by the candidate's answer) and ends each test with `{"verdict": status, "detail": text}`.
"""

import builtins
import os
import sys

# `_inside.py` beside this file, loaded by path (why: `_sandbox_runner._load`)
_inside = type(sys)("_inside")
_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_inside.py")
with open(_path, encoding="utf-8") as _f:
    exec(compile(_f.read(), _path, "exec"), _inside.__dict__)

_stdin = sys.stdin.buffer


def _send(msg):
    _inside.write_all(1, _inside.dumps(msg))


class CandidateFailed(BaseException):
    """Anything that went wrong on the candidate's side. The first one of a test is kept in
    `_FAILURES`, so the test fails even if its code catches everything."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        _FAILURES.append(self)


_FAILURES: list[CandidateFailed] = []


def _ask(msg):
    """Send one request for the candidate; its answer, or CandidateFailed."""
    _send(msg)
    try:
        answer = _inside.loads(_stdin.readline())
    except _inside.WireError as e:
        raise CandidateFailed("crash", f"unreadable answer: {e}") from None
    status = answer.get("status")
    if status == "ok":
        return answer
    detail = answer.get("detail", answer.get("message", ""))
    if status == "raised":
        status = "crash"  # the program's exception: one kind of failure, whatever its name
    status = status if status in ("timeout", "memory", "blocked") else "crash"
    raise CandidateFailed(status, str(detail)[:300] if type(detail) is str else "")


def _proxy(name):
    def call(*args, **kwargs):
        try:
            encoded = {
                "op": "call",
                "fn": name,
                "args": _inside.encode(list(args)),
                "kwargs": _inside.encode(dict(kwargs)),
            }
        except _inside.WireError as e:
            raise CandidateFailed("crash", f"argument of {name}(): {e}") from None
        try:
            return _inside.decode(_ask(encoded).get("value"))
        except _inside.WireError as e:
            raise CandidateFailed("wrong", f"unreadable value from {name}(): {e}") from None

    call.__name__ = name
    return call


def _program_names(names):
    """{name: proxy or decoded value} for those of `names` the program defines at module level."""
    answer = _ask({"op": "names", "names": sorted(names)})
    out = {}
    functions, values = answer.get("functions"), answer.get("values")
    for name in names:
        if type(functions) is list and name in functions:
            out[name] = _proxy(name)
        elif type(values) is dict and name in values:
            try:
                out[name] = _inside.decode(values[name])
            except _inside.WireError as e:
                raise CandidateFailed("wrong", f"unreadable value of {name}: {e}") from None
    return out


def _global_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


def _run(setup, test, entry):
    env = {"__name__": "__test__", "__builtins__": builtins}
    try:
        exec(compile(setup, "<setup>", "exec"), env)
        compiled = compile(test, "<test>", "exec")
    except BaseException as e:  # noqa: BLE001 - a broken test row
        return "crash", f"the test does not run: {type(e).__name__}: {e}"
    del _FAILURES[:]
    try:
        if entry:  # HumanEval: the entry point is the program's, even over the prompt's stub
            env[entry] = _proxy(entry)
        else:
            wanted = {
                n for n in _global_names(compiled) if n not in env and not hasattr(builtins, n)
            }
            for name in wanted & sys.stdlib_module_names:  # `math.isclose` without an import
                try:
                    env[name] = __import__(name)
                except ImportError:
                    pass
            wanted -= set(env)
            if wanted:
                env.update(_program_names(wanted))
        exec(compiled, env)
        if _FAILURES:
            raise _FAILURES[0]
    except AssertionError as e:
        return "wrong", f"AssertionError {e}"
    except CandidateFailed as e:
        e = _FAILURES[0] if _FAILURES else e
        return e.status, str(e)
    except NameError as e:
        hint = " (a helper the test calls must come from tests.prompt)" if entry else ""
        return "crash", f"NameError: {e}{hint}"
    except BaseException as e:  # noqa: BLE001 - raised by the test on the program's values
        return "crash", f"{type(e).__name__}: {e}"
    return "ok", ""


def main():
    job = _inside.loads(_stdin.readline())
    if job.get("drop_to") is not None:
        _inside.drop_privileges(job["drop_to"])
    sys.dont_write_bytecode = True
    for line in _stdin:
        i = _inside.loads(line)["run"]
        status, detail = _run(job["setup"], job["tests"][i], job.get("entry", ""))
        _send({"verdict": status, "detail": detail[:300]})


if __name__ == "__main__":
    main()
