"""Sandbox runner: `python -I -S _sandbox_runner.py`, started by `rewards/code.py`; never imported.

It reads one job (JSON on stdin: the program, the test inputs, the limits), isolates itself,
runs every test in a fresh forked child, and writes one JSON line per test to stdout. Expected
outputs never enter this process: stdin/stdout and call-based verdicts are decided by the caller,
so a program cannot read them from memory. Only the standard library is used, because this file
runs under `-I -S` (no project on sys.path) and must start fast.

Layers, outermost first (the docstring of `rewards/code.py` says what each does not cover):
1. namespaces: unshare(2) of a network namespace (no interfaces but a loopback that is down) and
   a PID namespace whose init runs the tests, so killing the runner's process group ends every
   descendant, even one that called setsid(); a user namespace too when not root.
2. privileges: a runner started as root drops to nobody (65534) after the namespaces are made,
   so file permissions deny writes outside the sandbox directory (chowned to nobody).
3. per test child: its own process group (killed as a group on timeout), rlimits on CPU time,
   address space, file size, open files, processes (RLIMIT_NPROC also counts threads), no core
   files; stdin from a memfd, stdout into a pipe read up to the output cap, stderr discarded.
4. an audit hook (PEP 578) installed in the child before the program runs: it refuses socket
   creation and name lookups, process creation (fork, exec, spawn, system, Popen), killing other
   processes, ctypes foreign calls and symbol lookups, file writes and metadata changes outside
   the sandbox directory, and reads outside the sandbox, Python's own installation and system
   library directories.
"""
import builtins
import contextlib
import json
import math
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
NOBODY = 65534
RESULT_FD = 3  # the child's verdict channel to the runner
EXIT_NO_RESULT = 70
PR_SET_PDEATHSIG = 1


def _emit(record):
    """One line to the caller. Flushed at once: the runner forks, and buffered text would be
    written twice."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------- isolation
def _unshare():
    """Enter new network + PID namespaces (+ a user namespace when not root). Returns None, or
    why not (e.g. EPERM in a container whose seccomp profile forbids unshare)."""
    import ctypes  # the runner's own use; candidate code never runs in this process
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    attempts = ([CLONE_NEWNET | CLONE_NEWPID] if uid == 0 else []) + [
        CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID]
    error = "unshare unavailable"
    for flags in attempts:
        if libc.unshare(flags) == 0:
            if flags & CLONE_NEWUSER:
                # Keep our own ids inside (setgroups must be denied before gid_map). If this
                # fails, unmapped ids still work: the process runs as the overflow id.
                with contextlib.suppress(OSError):
                    with open("/proc/self/setgroups", "w") as f:
                        f.write("deny")
                    with open("/proc/self/uid_map", "w") as f:
                        f.write(f"{uid} {uid} 1")
                    with open("/proc/self/gid_map", "w") as f:
                        f.write(f"{gid} {gid} 1")
            return None
        error = f"unshare(0x{flags:x}): {os.strerror(ctypes.get_errno())}"
    return error


def _world_readable(path):
    """Whether `path` and all its ancestors let anyone in (so nobody can still import)."""
    path = os.path.realpath(path)
    while True:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return True  # a missing sys.path entry is harmless
        if mode & 0o005 != 0o005:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _die_with_parent(parent):
    """SIGKILL this process when its parent dies (e.g. a reward-pool worker killed on timeout),
    so no sandbox outlives its caller. Set after any credential change, which clears it.
    `parent`: the parent's pid as seen here, to catch a parent that died before the call (None
    for a PID namespace's init, whose parent is invisible)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(EXIT_NO_RESULT)


def _drop_root(sandbox):
    """As root, become nobody so file permissions guard everything outside the sandbox; not when
    the Python installation is private to root (e.g. under /root), as imports would then fail."""
    if os.geteuid() != 0 or not all(_world_readable(p) for p in sys.path if p):
        return False
    try:
        os.chown(sandbox, NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    except OSError:
        return False
    return True


# ----------------------------------------------------------------------------------- the child
def _audit_hook(sandbox, violations):
    """PEP 578 hook refusing what a test program never needs. Refusals are recorded so that a
    failing test is reported as `blocked` rather than `crash`."""
    sandbox = os.path.realpath(sandbox)
    read_roots = {sandbox, "/usr", "/lib", "/lib64", "/etc", "/dev/null", "/dev/zero",
                  "/dev/urandom", "/dev/random", os.path.realpath("/proc/self")}
    for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]:
        if p:
            read_roots.add(os.path.realpath(p))
    read_roots = tuple(read_roots)
    deny_events = {
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__",
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
        "socket.gethostbyaddr", "socket.getnameinfo", "ctypes.dlsym", "ctypes.dlsym/handle",
        "ctypes.call_function", "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.string_at",
        "ctypes.wstring_at", "os.setxattr", "os.removexattr"}
    path_events = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                   "os.link": (0, 1), "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,),
                   "os.chown": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
                   "shutil.rmtree": (0,), "shutil.chown": (0,), "sqlite3.connect": (0,)}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep

    def inside(path, roots):
        if isinstance(path, int):  # an already open descriptor
            return True
        try:
            p = realpath(fspath(path).decode() if isinstance(path, bytes) else fspath(path))
        except (TypeError, ValueError):
            return False
        return any(p == r or p.startswith(r + sep) for r in roots)

    def deny(what):
        violations.append(what)
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event, args):
        if event in deny_events:
            deny(event)
        elif event == "ctypes.dlopen" and args and args[0] is not None:
            deny(f"ctypes.dlopen({args[0]!r})")
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and flags is not None and flags & write_flags)
            if not inside(path, (sandbox,) if writing else read_roots):
                deny(f"{'writing' if writing else 'reading'} {path!r}")
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and args[i] is not None and not inside(args[i], (sandbox,)):
                    if event == "sqlite3.connect" and args[i] == ":memory:":
                        continue
                    deny(f"{event}({args[i]!r})")

    sys.addaudithook(hook)


def _set_limits(lim):
    cpu = max(1, math.ceil(lim["cpu_s"]))
    mem = lim["memory_mb"] << 20
    for res, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
                       (resource.RLIMIT_FSIZE, (lim["max_file_bytes"],) * 2),
                       (resource.RLIMIT_NOFILE, (lim["max_open_files"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(res, value)
    resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))


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


def _plain(value, depth=0):
    """JSON-ready copy of a return value made of plain types; tuples become lists (the datasets
    store JSON). Anything else (e.g. an object overriding __eq__) is refused."""
    if depth > 100:
        raise TypeError("nesting deeper than 100")
    t = type(value)
    if value is None or t in (bool, str):
        return value
    if t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else repr(value)
    if t in (list, tuple):
        return [_plain(v, depth + 1) for v in value]
    if t.__module__ == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
        return _plain(value.tolist(), depth + 1)
    if t is dict and all(type(k) is str for k in value):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"return value of type {t.__name__} is not plain data")


def _child(job, compiled, test):
    """Runs in the forked child; descriptors 0-3 are already in place. Never returns."""
    lim, mode = job["limits"], job["mode"]
    status, detail, value = "ok", "", None
    violations = []
    try:
        _set_limits(lim)
        sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
        sys.dont_write_bytecode = True  # no __pycache__ writes into the installation
        builtins.exit = builtins.quit = sys.exit  # what `site` would have added (-S)
        if job["audit_hook"]:
            _audit_hook(job["sandbox"], violations)
        env = {"__name__": "__main__" if mode == "stdio" else "solution",
               "__builtins__": builtins}
        try:
            exec(compiled, env)
            if mode == "call":
                fn = env.get(job["fn_name"])
                if fn is None and isinstance(env.get("Solution"), type):
                    fn = getattr(env["Solution"](), job["fn_name"], None)
                if not callable(fn):
                    raise NameError(f"no function {job['fn_name']!r} defined")
                result = fn(*test)
                try:
                    value = json.dumps(_plain(result))
                except (TypeError, ValueError, RecursionError) as e:
                    status, detail = "wrong", str(e)  # not data the test could equal
            elif mode == "assert":
                exec(compile(job["setup"] + "\n" + test, "<test>", "exec"), env)
        except SystemExit as e:
            if mode != "stdio" or e.code not in (None, 0):
                status, detail = "crash", f"SystemExit({e.code!r})"
        except MemoryError:
            status, detail = "memory", "MemoryError"
        except AssertionError as e:
            status, detail = ("wrong" if mode == "assert" else "crash"), f"AssertionError {e}"
        except BaseException as e:  # the program's own failure, whatever it is
            try:
                detail = f"{type(e).__name__}: {e}"
            except BaseException:
                detail = type(e).__name__
            status = "crash"
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        if violations and status != "ok":
            status, detail = "blocked", violations[0]
        record = json.dumps({"status": status, "detail": detail[:300], "value": value})
        os.write(RESULT_FD, record.encode())
        os._exit(0)
    except MemoryError:
        os._exit(EXIT_NO_RESULT + 1)
    finally:
        os._exit(EXIT_NO_RESULT)


# ---------------------------------------------------------------------------------- the runner
def _collect(pid, out_r, res_r, deadline, cap):
    """Read the child's stdout and verdict until it exits, its output passes `cap` bytes, or the
    deadline. Returns (reason or None, the pid still to reap or -1, stdout, verdict bytes)."""
    bufs = {out_r: bytearray(), res_r: bytearray()}
    open_fds = {out_r, res_r}
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None  # kernels before 5.3: poll
    exited, reason = False, None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = "timeout"
            break
        waits = list(open_fds) + ([pidfd] if pidfd is not None and not exited else [])
        timeout = remaining if pidfd is not None else min(remaining, 0.005)
        if waits:
            ready = select.select(waits, [], [], timeout)[0]
        else:
            ready = []
            time.sleep(timeout)
        if pidfd is None and not exited:
            exited = os.waitpid(pid, os.WNOHANG)[0] != 0 if ready == [] else False
            if exited:
                pid = -1  # reaped; the caller must not wait again
        for fd in ready:
            if fd == pidfd:
                exited = True
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                open_fds.discard(fd)
            bufs[fd] += data
            if len(bufs[fd]) > cap:
                reason = "output"
        if reason:
            break
        if exited:
            for fd in list(open_fds):  # what the child wrote is in the pipe; descendants may
                os.set_blocking(fd, False)  # keep it open, so read without waiting for EOF
                try:
                    while len(bufs[fd]) <= cap:
                        data = os.read(fd, 1 << 16)
                        if not data:
                            break
                        bufs[fd] += data
                except BlockingIOError:
                    pass
            if len(bufs[out_r]) > cap or len(bufs[res_r]) > cap:
                reason = "output"
            break
    if pidfd is not None:
        os.close(pidfd)
    return reason, pid, bytes(bufs[out_r][:cap]), bytes(bufs[res_r])


def _run_one(job, compiled, i, test, deadline):
    lim = job["limits"]
    cap = lim["max_output_bytes"]
    if job["mode"] == "stdio":
        in_fd = os.memfd_create("stdin")
        data = test.encode()
        view = memoryview(data)
        while view:
            view = view[os.write(in_fd, view):]
        os.lseek(in_fd, 0, os.SEEK_SET)
    else:
        in_fd = os.open(os.devnull, os.O_RDONLY)
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    runner = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            for src, dst in ((in_fd, 0), (out_w, 1), (devnull, 2), (res_w, RESULT_FD)):
                os.dup2(src, dst)
            os.closerange(RESULT_FD + 1, 1 << 16)
            _die_with_parent(runner)
            _child(job, compiled, test)
        finally:
            os._exit(EXIT_NO_RESULT)
    try:
        os.setpgid(pid, pid)  # also from this side: no window where a kill misses the group
    except OSError:
        pass
    for fd in (in_fd, out_w, res_w):
        os.close(fd)
    test_deadline = time.monotonic() + lim["timeout_s"]
    reason, wait_pid, out, res = _collect(pid, out_r, res_r, min(test_deadline, deadline), cap)
    for fd in (out_r, res_r):
        os.close(fd)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    wstatus = os.waitpid(pid, 0)[1] if wait_pid > 0 else 0
    record = {"i": i, "status": "crash", "detail": "", "output": out.decode("utf-8", "replace")}
    if reason == "timeout":
        record.update(status="timeout", detail=f"wall time over {lim['timeout_s']} s"
                      if test_deadline <= deadline else "program over total_timeout_s")
    elif reason == "output":
        record.update(status="wrong", detail=f"output over {cap} bytes")
    else:
        try:
            verdict = json.loads(res)
            status, detail, value = verdict["status"], str(verdict["detail"]), verdict["value"]
        except (ValueError, KeyError, TypeError):
            verdict = None
        if verdict is not None and status in ("ok", "wrong", "crash", "memory", "blocked"):
            record.update(status=status, detail=detail,
                          output=value if job["mode"] == "call" and isinstance(value, str)
                          else out.decode("utf-8", "replace"))
        elif os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            cpu = sig in (signal.SIGXCPU, signal.SIGKILL)
            record.update(status="timeout" if cpu else "crash",
                          detail=f"killed by {signal.Signals(sig).name}"
                          + (f" (cpu limit {lim['cpu_s']} s)" if cpu else ""))
        else:
            code = os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else -1
            record.update(status="memory" if code == EXIT_NO_RESULT + 1 else "crash",
                          detail=f"exited with code {code} before reporting a result")
    return record


def _run_all(job, deadline):
    # RLIMIT_NPROC counts every task (thread) of the uid, in older kernels across namespaces too,
    # and concurrent sandboxes share the uid: allow `max_processes` beyond the current count.
    # Root is exempt from the limit, so skip the scan of /proc.
    lim = job["limits"]
    lim["nproc"] = lim["max_processes"] + (0 if os.geteuid() == 0 else _tasks_of_uid(os.getuid()))
    try:
        compiled = compile(job["code"], "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        for i in range(len(job["tests"])):
            _emit({"i": i, "status": "crash", "detail": f"{type(e).__name__}: {e}"[:300],
                   "output": ""})
        return
    for i, test in enumerate(job["tests"]):
        if time.monotonic() >= deadline:
            return  # the caller counts the tests not reported as timeouts
        _emit(_run_one(job, compiled, i, test, deadline))


def main():
    job = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    # Started with -S for speed: installed packages are importable, .pth files are not run.
    sys.path.extend(job["site_packages"])
    deadline = time.monotonic() + job["total_timeout_s"]
    error = None if job["namespaces"] == "off" else _unshare()
    namespaces = job["namespaces"] != "off" and error is None
    if job["namespaces"] == "require" and not namespaces:
        _emit({"isolation": {"namespaces": False, "error": error}, "fatal": error})
        return
    dropped = _drop_root(job["sandbox"])
    _die_with_parent(job["parent"])
    _emit({"isolation": {"namespaces": namespaces, "namespace_error": error,
                         "dropped_root": dropped, "audit_hook": job["audit_hook"]}})
    if not namespaces:
        _run_all(job, deadline)
        return
    pid = os.fork()  # PID 1 of the new namespace: when it dies, every process in it dies
    if pid == 0:
        try:
            _die_with_parent(None)
            _run_all(job, deadline)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
