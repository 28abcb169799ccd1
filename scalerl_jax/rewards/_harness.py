"""The trusted harness of assert-based tests (MBPP asserts, HumanEval `check(candidate)`):
`python -I -S _harness.py`, started by `rewards/sandbox.py` in a sandbox of its own; never
imported.

The test code runs here, never in the candidate's process. Every name the test uses that the
test does not define itself (`candidate`'s function, helpers of the program such as HumanEval's
`poly`) is a proxy: calling it sends the arguments to the candidate's process through the trusted
side, and what comes back is plain data decoded by `_inside` (no object of the candidate's, so no
`__eq__` that is always true). Asserts then compare builtin values with builtin `==`. An
exception the candidate raised is raised here as the builtin exception of the same name (so a
test expecting `ValueError` still works); its timeouts and crashes end the test.

Protocol, one JSON line each way: stdin gets the job (`setup`, `tests`), then `{"run": i}`; this
process answers with `{"op": "call", ...}` lines (each followed on stdin by the candidate's
answer) and ends each test with `{"verdict": status, "detail": text}`.
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
    """The candidate's process timed out, crashed or ran out of memory. The first one of a test
    is also kept in `_FAILURES`, so the test fails even if its code catches everything."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        _FAILURES.append(self)


_FAILURES: list[CandidateFailed] = []


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
            raise CandidateFailed("unsupported", f"argument of {name}(): {e}") from None
        _send(encoded)
        answer = _inside.loads(_stdin.readline())
        status = answer.get("status")
        if status == "ok":
            return _inside.decode(answer.get("value"))
        if status == "raised":
            kind = getattr(builtins, str(answer.get("type")), None)
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                kind = RuntimeError
            raise kind(str(answer.get("message", ""))[:300])
        raise CandidateFailed(str(status), str(answer.get("detail", ""))[:300])

    call.__name__ = name
    return call


def _global_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


def _run(setup, test):
    env = {"__name__": "__test__", "__builtins__": builtins}
    try:
        exec(compile(setup, "<setup>", "exec"), env)
        compiled = compile(test, "<test>", "exec")
    except BaseException as e:  # noqa: BLE001 - a broken test row
        return "crash", f"the test does not run: {type(e).__name__}: {e}"
    for name in _global_names(compiled):
        if name not in env and not hasattr(builtins, name):
            env[name] = _proxy(name)
    del _FAILURES[:]
    try:
        exec(compiled, env)
        if _FAILURES:
            raise _FAILURES[0]
    except AssertionError as e:
        return "wrong", f"AssertionError {e}"
    except CandidateFailed as e:
        e = _FAILURES[0] if _FAILURES else e
        return e.status, str(e)
    except _inside.WireError as e:
        return "wrong", f"unreadable value from the program: {e}"
    except BaseException as e:  # noqa: BLE001 - raised by the program or by the test on it
        return "crash", f"{type(e).__name__}: {e}"
    return "ok", ""


def main():
    job = _inside.loads(_stdin.readline())
    if job.get("drop_to") is not None:
        _inside.drop_privileges(job["drop_to"])
    sys.dont_write_bytecode = True
    for line in _stdin:
        i = _inside.loads(line)["run"]
        status, detail = _run(job["setup"], job["tests"][i])
        _send({"verdict": status, "detail": detail[:300]})


if __name__ == "__main__":
    main()
