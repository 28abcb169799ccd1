"""The candidate's side of the code sandbox: `python -I -S _sandbox_runner.py`, started by
`rewards/sandbox.py` inside the isolation layer; never imported. It reads the job (program,
limits) as the first line of stdin, then answers one line per request line:
`{"op": "stdio", "stdin": text}` runs the program as `__main__` in a fresh child;
`{"op": "load"}` starts a child holding the program as module `solution`, which `call`, `names`
and `unload` then use (one test's calls go to one child; `timeout_s` counts from `load`).

Nothing here decides a verdict, so a program that takes over this process can only choose what
it answers. Each child gets its own process group and rlimits; in the weak mode this process
also tries namespaces, drops root, and is a child subreaper with an audit hook per child.
"""

import builtins
import math
import os
import resource
import select
import signal
import sys
import time


def _load(name):
    """A module beside this file, loaded by path: putting this directory on sys.path would let
    its modules (math.py, code.py) shadow the standard library's for the program too."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    module = type(sys)(name)  # importlib.util would cost more start-up than this file
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), module.__dict__)
    return module


_inside = _load("_inside")
_weak = None  # _weak.py, loaded in the weak mode only

STATUS_FD = 3  # the child's report to this process
REQUEST_FD = 4  # requests of a loaded program's calls
EXIT_NO_RESULT = 70
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _emit(msg):
    """One answer line. Written at once, with nothing buffered that a fork would copy."""
    _inside.write_all(1, _inside.dumps(msg))


def _prctl(option, value):
    import ctypes  # the runner's own use; a candidate program never runs in this process

    return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


# ----------------------------------------------------------------------------- the children
def _set_limits(lim):
    cpu = max(1, math.ceil(lim["cpu_s"]))
    mem = lim["memory_mb"] << 20
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (lim["max_file_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (lim["max_open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NPROC, (lim["nproc"],) * 2),
    ):
        resource.setrlimit(res, value)


def _prepare_child(job, violations):
    _set_limits(job["limits"])
    sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    sys.dont_write_bytecode = True
    builtins.exit = builtins.quit = sys.exit  # what `site` would have added (-S)
    if job["weak"]:
        _weak.audit_hook(job["workdir"], violations)


def _failure(e, violations):
    """(status, detail) of an exception out of the program."""
    if isinstance(e, MemoryError):
        return "memory", "MemoryError"
    try:
        detail = f"{type(e).__name__}: {e}"
    except BaseException:  # noqa: BLE001 - a program's exception whose str() raises
        detail = type(e).__name__
    return ("blocked", violations[0]) if violations else ("crash", detail)


def _report(msg):
    _inside.write_all(STATUS_FD, _inside.dumps(msg))


def _stdio_child(job, compiled):
    violations = []
    status, detail = "ok", ""
    try:
        _prepare_child(job, violations)
        try:
            exec(compiled, {"__name__": "__main__", "__builtins__": builtins})
        except SystemExit as e:
            if e.code not in (None, 0):
                status, detail = "crash", f"SystemExit({e.code!r})"
        except BaseException as e:  # noqa: BLE001 - the program's own failure, whatever it is
            status, detail = _failure(e, violations)
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001 - e.g. a closed or replaced stdout
            pass
        _report({"status": status, "detail": detail[:300]})
        os._exit(0)
    except MemoryError:
        os._exit(EXIT_NO_RESULT + 1)
    finally:
        os._exit(EXIT_NO_RESULT)


def _names(env, req):
    """Which of the names asked for the loaded program defines: functions (called through the
    trusted side) and values (sent as data; one that is not data is left out)."""
    functions, values = [], {}
    for name in req.get("names", ()):
        if type(name) is str and name in env:
            if callable(env[name]):
                functions.append(name)
            else:
                try:
                    values[name] = _inside.encode(env[name])
                except (_inside.WireError, RecursionError):
                    pass
    return {"status": "ok", "functions": functions, "values": values}


def _call(env, req):
    """One call of a loaded program: {"status": "ok", "value"} or how it failed."""
    if req.get("op") == "names":
        return _names(env, req)
    name = req.get("fn")
    fn = env.get(name) if type(name) is str else None
    if fn is None and isinstance(env.get("Solution"), type):  # LeetCode-style classes
        fn = getattr(env["Solution"](), name, None)
    if not callable(fn):
        return {"status": "raised", "type": "NameError", "message": f"no function {name!r}"}
    args = _inside.decode(req.get("args", []))
    kwargs = _inside.decode(req.get("kwargs", {"$d": []}))
    result = fn(*args, **kwargs)
    try:
        return {"status": "ok", "value": _inside.encode(result)}
    except (_inside.WireError, RecursionError) as e:  # not data a test could equal
        return {"status": "wrong", "detail": f"return value: {e}"}


def _session_child(job, compiled):
    violations = []
    try:
        _prepare_child(job, violations)
        env = {"__name__": "solution", "__builtins__": builtins}
        try:
            exec(compiled, env)
            _report({"status": "ok"})
        except BaseException as e:  # noqa: BLE001
            status, detail = _failure(e, violations)
            _report({"status": status, "detail": detail[:300]})
            os._exit(0)
        requests = open(REQUEST_FD, "rb", closefd=False)
        for line in requests:
            try:
                answer = _call(env, _inside.loads(line))
            except (SystemExit, KeyboardInterrupt, GeneratorExit) as e:
                answer = {"status": "crash", "detail": f"{type(e).__name__} in the call"}
            except BaseException as e:  # noqa: BLE001 - raised by the program: the test sees it
                status, detail = _failure(e, violations)
                answer = (
                    {"status": status, "detail": detail[:300]}
                    if status != "crash"
                    else {"status": "raised", "type": type(e).__name__, "message": detail[:300]}
                )
            _report(answer)
        os._exit(0)
    except MemoryError:
        os._exit(EXIT_NO_RESULT + 1)
    finally:
        os._exit(EXIT_NO_RESULT)


class Child:
    """A forked child running the program, in its own process group."""

    def __init__(self, job, target, compiled, stdin_text=None):
        self.job, self.cap = job, job["limits"]["max_output_bytes"]
        if stdin_text is not None:
            # an unlinked file in the sandbox's tmpfs (memfd_create is denied by the seccomp
            # filter: its memory would escape the limits)
            in_fd = os.open(job["workdir"], os.O_TMPFILE | os.O_RDWR, 0o600)
            _inside.write_all(in_fd, stdin_text.encode())
            os.lseek(in_fd, 0, os.SEEK_SET)
        else:
            in_fd = os.open(os.devnull, os.O_RDONLY)
        self.out_r, out_w = os.pipe()
        self.status_r, status_w = os.pipe()
        req_r, self.req_w = os.pipe()
        runner = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.setpgid(0, 0)
                devnull = os.open(os.devnull, os.O_WRONLY)
                # a loaded program's prints are not part of any verdict: discarded
                stdout = out_w if stdin_text is not None else devnull
                for src, dst in (
                    (in_fd, 0),
                    (stdout, 1),
                    (devnull, 2),
                    (status_w, STATUS_FD),
                    (req_r, REQUEST_FD),
                ):
                    os.dup2(src, dst)
                os.closerange(REQUEST_FD + 1, 1 << 16)
                _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != runner:
                    os._exit(EXIT_NO_RESULT)
                target(job, compiled)
            finally:
                os._exit(EXIT_NO_RESULT)
        try:
            os.setpgid(self.pid, self.pid)  # from this side too: no window for a missed kill
        except OSError:
            pass
        for fd in (in_fd, out_w, status_w, req_r):
            os.close(fd)
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # kernels before 5.3: wait for the pipes to close
            self.pidfd = None
        self.deadline = time.monotonic() + job["limits"]["timeout_s"]
        self.stdout = bytearray()
        self.status_buf = bytearray()
        self.alive = True

    def _read(self, fd, buf):
        """Whatever `fd` has now into `buf`: False at end of file."""
        data = os.read(fd, 1 << 16)
        buf += data
        return bool(data)

    def read_status(self, until_exit=False):
        """The next status line of the child (None when it ended without one) and why not:
        'timeout', 'output' or None. With `until_exit`, read until the child itself exits (a
        process it left behind may hold the pipes open: it dies with the test's group)."""
        open_fds = [self.out_r, self.status_r]
        bufs = {self.out_r: self.stdout, self.status_r: self.status_buf}
        while True:
            line, sep, rest = self.status_buf.partition(b"\n")
            if sep and not until_exit:
                self.status_buf = bytearray(rest)
                return bytes(line), None
            if any(len(b) > self.cap + 4096 for b in bufs.values()):
                return None, "output"
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                return None, "timeout"
            waits = open_fds + ([self.pidfd] if until_exit and self.pidfd is not None else [])
            ready = select.select(waits, [], [], remaining)[0]
            if self.pidfd in ready or not open_fds:  # exited: take what is in the pipes
                for fd in open_fds:
                    os.set_blocking(fd, False)
                    try:
                        while len(bufs[fd]) <= self.cap + 4096 and self._read(fd, bufs[fd]):
                            pass
                    except BlockingIOError:
                        pass
                if any(len(b) > self.cap + 4096 for b in bufs.values()):
                    return None, "output"
                return (bytes(self.status_buf.partition(b"\n")[0]) or None), None
            for fd in ready:
                if not self._read(fd, bufs[fd]):
                    open_fds.remove(fd)
            if self.status_r not in open_fds and not until_exit:
                return (bytes(self.status_buf.partition(b"\n")[0]) or None), None

    def send(self, line):
        try:
            _inside.write_all(self.req_w, line)
            return True
        except OSError:
            return False

    def kill(self):
        """SIGKILL the group and reap: the group id cannot have been reused before the reap."""
        if not self.alive:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.wstatus = os.waitpid(self.pid, 0)[1]
        self.alive = False
        for fd in (self.out_r, self.status_r, self.req_w, self.pidfd):
            if fd is not None:
                os.close(fd)

    def ended(self, reason):
        """The answer for a child that reported nothing more: how it ended."""
        self.kill()
        lim = self.job["limits"]
        if reason == "timeout":
            return {"status": "timeout", "detail": f"wall time over {lim['timeout_s']} s"}
        if reason == "output":
            return {"status": "output", "detail": f"output over {self.cap} bytes"}
        w = self.wstatus
        if os.WIFSIGNALED(w):
            sig = os.WTERMSIG(w)
            cpu = sig in (signal.SIGXCPU, signal.SIGKILL)
            return {
                "status": "timeout" if cpu else "crash",
                "detail": f"killed by {signal.Signals(sig).name}"
                + (f" (cpu limit {lim['cpu_s']} s)" if cpu else ""),
            }
        code = os.WEXITSTATUS(w) if os.WIFEXITED(w) else -1
        return {
            "status": "memory" if code == EXIT_NO_RESULT + 1 else "crash",
            "detail": f"exited with code {code} before reporting a result",
        }


def _answer(child, line, reason):
    """The answer line for `line` read from a child (raw; the trusted side parses it)."""
    if line is None:
        return _inside.dumps(child.ended(reason))
    return line + b"\n"


def _run_stdio(job, compiled, text):
    child = Child(job, _stdio_child, compiled, stdin_text=text)
    line, reason = child.read_status(until_exit=True)
    if line is not None and reason is None:
        try:
            status = _inside.loads(line)
        except _inside.WireError:
            status = {"status": "crash", "detail": "unreadable report"}
    else:
        status = child.ended(reason)
    child.kill()
    out = bytes(child.stdout[: child.cap]).decode("utf-8", "replace")
    status["stdout"] = out
    return _inside.dumps(status)


def serve(job, compiled_or_error):
    session = None
    requests = sys.stdin.buffer
    for line in requests:
        try:
            req = _inside.loads(line)
        except _inside.WireError:
            return
        op = req.get("op")
        if isinstance(compiled_or_error, str):  # the program does not compile
            if op == "unload":
                answer = _inside.dumps({"status": "ok"})
            else:
                answer = _inside.dumps({"status": "crash", "detail": compiled_or_error})
        elif op == "stdio":
            answer = _run_stdio(job, compiled_or_error, str(req.get("stdin", "")))
        elif op == "load":
            if session is not None:
                session.kill()
            session = Child(job, _session_child, compiled_or_error)
            status, reason = session.read_status()
            answer = _answer(session, status, reason)
        elif op in ("call", "names"):
            if session is None or not session.alive:
                answer = _inside.dumps({"status": "crash", "detail": "the program has ended"})
            elif not session.send(line if line.endswith(b"\n") else line + b"\n"):
                answer = _inside.dumps(session.ended(None))
            else:
                status, reason = session.read_status()
                answer = _answer(session, status, reason)
        elif op == "unload":
            if session is not None:
                session.kill()
                session = None
            answer = _inside.dumps({"status": "ok"})
        else:
            answer = _inside.dumps({"status": "crash", "detail": f"unknown op {op!r}"})
        _inside.write_all(1, answer)


def _tasks_of_uid(uid):
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                if int(fields["Uid"].split()[1]) == uid:
                    count += int(fields["Threads"])
            except (OSError, KeyError, ValueError, IndexError):
                pass
    return count


def main():
    job = _inside.loads(sys.stdin.buffer.readline())
    sys.path.extend(job["site_packages"])
    info = {"mode": "weak" if job["weak"] else "bwrap"}
    if job["drop_to"] is not None:  # bubblewrap started as root: the program never is
        try:
            _inside.drop_privileges(job["drop_to"])
        except OSError as e:
            _emit({"fatal": f"cannot drop root to uid {job['drop_to']}: {e}"})
            return
    namespaces = False
    if job["weak"]:
        global _weak
        _weak = _load("_weak")
        info["namespace_error"] = _weak.unshare()
        namespaces = info["namespace_error"] is None
        info["dropped_root"] = _weak.drop_root(job["workdir"], _inside.drop_privileges)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans stay in our tree, for the final kill
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    info.update(namespaces=namespaces or not job["weak"], uid=os.getuid())
    # RLIMIT_NPROC counts every task of the uid (in the strong mode a uid or user namespace of
    # this sandbox's own; in the weak mode shared): allow `max_processes` beyond the current
    # count. It does not bind root (weak mode as root).
    lim = job["limits"]
    lim["nproc"] = lim["max_processes"] + (0 if os.geteuid() == 0 else _tasks_of_uid(os.getuid()))
    try:
        compiled = compile(job["code"], "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        compiled = f"{type(e).__name__}: {e}"[:300]
    _emit({"isolation": info})
    if not namespaces:
        serve(job, compiled)
        return
    pid = os.fork()  # PID 1 of the new namespace: when it dies, every process in it dies
    if pid == 0:
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            serve(job, compiled)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
