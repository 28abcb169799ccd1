"""The weak mode's layers, for `_sandbox_runner.py` where bubblewrap is not used (see
`rewards/sandbox.py`): network/PID namespaces where unshare(2) is allowed, a drop to nobody where
the Python installation stays importable for nobody, and a PEP 578 audit hook. Loaded by path in
the weak mode only; standard library only.
"""

import contextlib
import os
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
NOBODY = 65534


def unshare():
    """Network + PID namespaces (+ a user namespace when not root): None, or why not."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    attempts = ([CLONE_NEWNET | CLONE_NEWPID] if uid == 0 else []) + [
        CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID
    ]
    error = "unshare unavailable"
    for flags in attempts:
        if libc.unshare(flags) == 0:
            if flags & CLONE_NEWUSER:
                # A failed mapping is not an error: unmapped ids still work, the process runs
                # as the overflow id.
                with contextlib.suppress(OSError):
                    for name, text in (
                        ("setgroups", "deny"),
                        ("uid_map", f"{uid} {uid} 1"),
                        ("gid_map", f"{gid} {gid} 1"),
                    ):
                        with open(f"/proc/self/{name}", "w") as f:
                            f.write(text)
            return None
        error = f"unshare(0x{flags:x}): {os.strerror(ctypes.get_errno())}"
    return error


def _world_readable(path):
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


def drop_root(workdir, drop_privileges):
    """As root, become nobody when the installation stays importable for nobody."""
    if os.geteuid() != 0 or not all(_world_readable(p) for p in sys.path if p):
        return False
    try:
        os.chown(workdir, NOBODY, NOBODY)
        drop_privileges(NOBODY)
    except OSError:
        return False
    return True


# Events a test program never needs, refused outright.
_DENY_EVENTS = {
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "subprocess.Popen",
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "socket.__new__",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyname_ex",
    "socket.gethostbyaddr",
    "socket.getnameinfo",
    "ctypes.dlsym",
    "ctypes.dlsym/handle",
    "ctypes.call_function",
    "ctypes.cdata",
    "ctypes.cdata/buffer",
    "ctypes.string_at",
    "ctypes.wstring_at",
    "os.setxattr",
    "os.removexattr",
    "sqlite3.connect",
}
# Path events: the positions of the arguments that must lie inside the work directory.
_PATH_EVENTS = {
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.link": (0, 1),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.utime": (0,),
    "os.chflags": (0,),
    "os.lchflags": (0,),
    "shutil.rmtree": (0,),
    "shutil.chown": (0,),
}


def audit_hook(workdir, violations):
    """PEP 578 hook of the weak mode: refuses what a test program never needs. It binds only
    Python-level calls, and a program aimed at it can undo it; the strong mode does not rely
    on it."""
    workdir = os.path.realpath(workdir)
    read_roots = {
        workdir,
        "/usr",
        "/lib",
        "/lib64",
        "/etc",
        "/dev/null",
        "/dev/zero",
        "/dev/urandom",
        "/dev/random",
        os.path.realpath("/proc/self"),
    }
    for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]:
        if p:
            read_roots.add(os.path.realpath(p))
    read_roots = tuple(read_roots)
    deny_events, path_events = _DENY_EVENTS, _PATH_EVENTS  # bound in the hook's closure
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep

    def inside(path, roots):
        if isinstance(path, int):
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
                mode is None and flags is not None and flags & write_flags
            )
            if not inside(path, (workdir,) if writing else read_roots):
                deny(f"{'writing' if writing else 'reading'} {path!r}")
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and args[i] is not None and not inside(args[i], (workdir,)):
                    deny(f"{event}({args[i]!r})")

    sys.addaudithook(hook)
