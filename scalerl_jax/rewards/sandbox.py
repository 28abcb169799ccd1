"""Starting and ending the processes of the code sandbox, in one of two isolation modes.

**bwrap** (strong): bubblewrap namespaces, a read-only root of /usr and the Python installation,
a size-limited tmpfs, a uid of the sandbox's own (or its own user namespace), no capability,
no-new-privileges and a seccomp filter; killing bubblewrap ends every process of the sandbox.
**weak** (only where accepted): a plain `python -I -S` process with what unshare(2) allows and
a PEP 578 audit hook. Every step on this side has a deadline; the verdict is decided outside
(rewards/code.py). What each mode gives the program: docs/rewards.md, "Code rewards".
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import select
import shutil
import signal
import site
import struct
import subprocess
import sys
import tempfile
import time
from typing import IO, Optional, cast

from scalerl_jax.errors import UserError
from scalerl_jax.rewards import _inside
from scalerl_jax.rewards.sandbox_policy import UidLease, seccomp_bpf

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "_sandbox_runner.py")
HARNESS = os.path.join(HERE, "_harness.py")
ISOLATIONS = ("strong", "best", "weak")
_SITE_PACKAGES = tuple(os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p))
_PYTHON = os.path.realpath(sys.executable)
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def owner_tag() -> str:
    """An argument (ignored) on every sandboxed process's command line naming the process that
    started it, so that leftovers of one caller can be told from another's (e.g. tests running
    in parallel)."""
    return f"--scalerl-sandbox-of={os.getpid()}"


class SandboxUnavailable(UserError, RuntimeError):
    """The strong mode was asked for and this host cannot provide it."""


def _read_only_paths() -> list[str]:
    """What the sandbox sees of the host: the Python installation, its packages, these scripts.
    Paths inside another listed path are dropped (bubblewrap binds each once)."""
    paths = {
        os.path.realpath(p)
        for p in (
            sys.prefix,
            sys.base_prefix,
            sys.exec_prefix,
            sys.base_exec_prefix,
            os.path.dirname(_PYTHON),
            HERE,
            *_SITE_PACKAGES,
        )
    }
    paths = {p for p in paths if os.path.isdir(p) and not p.startswith("/usr/")}
    return sorted(p for p in paths if not any(p != q and p.startswith(q + os.sep) for q in paths))


def _bwrap_args(tmpfs_bytes: int, seccomp_fd: int) -> list[str]:
    args = [
        "bwrap",
        "--seccomp",
        str(seccomp_fd),
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]
    if os.geteuid() == 0:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns"]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # The tmpfs first: a checkout or an installation under /tmp is then bound on top of it
    # instead of being hidden by it.
    args += ["--size", str(tmpfs_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
    made = {"/tmp"}
    for path in _read_only_paths():
        parents = []
        parent = os.path.dirname(path)
        while parent not in ("/", "") and parent not in made:
            parents.append(parent)
            parent = os.path.dirname(parent)
        for p in reversed(parents):  # searchable by the sandbox's uid, whatever the host's mode
            args += ["--perms", "0755", "--dir", p]
            made.add(p)
        args += ["--ro-bind", path, path]
    # /dev read-only: its tmpfs (and /dev/shm in it) would be memory no limit counts
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev", "--remount-ro", "/"]
    args += ["--chdir", "/tmp"]
    for key, value in {**_ENV, "HOME": "/tmp", "TMPDIR": "/tmp"}.items():
        args += ["--setenv", key, value]
    return args


@contextlib.contextmanager
def _seccomp_fd():
    """The filter on a pipe's read end, for one bubblewrap start (`pass_fds` keeps its number)."""
    r, w = os.pipe()
    try:
        os.write(w, seccomp_bpf())  # a few hundred bytes: below the pipe's buffer
        os.close(w)
        w = -1
        yield r
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)


@functools.lru_cache(maxsize=None)
def bwrap_status() -> tuple[bool, str]:
    """(usable, why not): whether bubblewrap is installed and can start a sandbox here (user
    namespaces may be forbidden, e.g. by a container's seccomp profile). Checked once per
    process with a real start."""
    if shutil.which("bwrap") is None:
        return False, "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        seccomp_bpf()
    except RuntimeError as e:
        return False, f"no seccomp filter: {e}"
    try:
        with _seccomp_fd() as fd:
            cmd = _bwrap_args(1 << 20, fd) + [_PYTHON, "-I", "-S", "-c", "pass"]
            proc = subprocess.run(cmd, capture_output=True, timeout=30, cwd="/", pass_fds=(fd,))
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap did not start: {e}"
    if proc.returncode != 0:
        return False, f"bwrap failed here: {proc.stderr.decode(errors='replace').strip()[:300]}"
    return True, ""


def resolve_mode(isolation: str) -> str:
    """'bwrap' or 'weak' for `SandboxLimits.isolation`; SandboxUnavailable when 'strong' cannot
    be met, saying why and what to do."""
    if isolation == "weak":
        return "weak"
    usable, why = bwrap_status()
    if usable:
        return "bwrap"
    if isolation == "best":
        return "weak"
    raise SandboxUnavailable(
        f"code rewards need the strong sandbox and this host cannot give it ({why}). Install "
        "bubblewrap, or accept the weaker isolation explicitly with "
        "SandboxLimits(isolation='best') / rewards.code_isolation=best"
    )


def describe(isolation: str) -> str:
    """One line for a run's log: which mode code rewards use here and what it holds."""
    mode = resolve_mode(isolation)
    if mode == "bwrap":
        who = (
            "a uid of its own per sandbox, no capabilities"
            if os.geteuid() == 0
            else (f"uid {os.geteuid()} in a user namespace of its own, no capabilities")
        )
        return (
            f"code sandbox: bubblewrap (mount, PID, network, IPC, UTS namespaces; read-only "
            f"system; tmpfs /tmp; {who}; seccomp: no namespaces, keyrings, ptrace, mounts, "
            f"memfd/shm)"
        )
    return (
        "code sandbox: WEAK mode (rlimits, audit hook, network/PID namespaces where allowed; "
        "a program aimed at the audit hook can read and write as the trainer's uid)"
    )


# ---------------------------------------------------------------------------------- processes
def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            out.append(pid)
            todo.append(pid)
    return out


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602


def _remove_tree(path: str) -> None:
    """rmtree that first clears inode flags (immutable, append-only) a program may have set."""
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                continue
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError:
                continue
            with contextlib.suppress(OSError):
                flags = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 4))[0]
                if flags & 0x30:  # FS_IMMUTABLE_FL | FS_APPEND_FL
                    fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags & ~0x30))
            os.close(fd)
    shutil.rmtree(path, ignore_errors=True)


class Process:
    """One sandboxed script (the runner or the harness) and its line protocol. `request` and
    `read` return None when the process does not answer by the deadline or answers garbage; the
    caller treats that as the test's failure and closes the process. Nothing here blocks past a
    deadline: `send` writes without blocking (a stopped or non-reading process only runs out the
    deadline), `read` stops at `max_line` bytes."""

    def __init__(
        self, script: str, mode: str, job: dict, tmpfs_bytes: int, max_line: int, deadline: float
    ):
        self.mode, self.max_line = mode, max_line
        self.workdir: Optional[str] = None
        self.lease: Optional[UidLease] = None
        with contextlib.ExitStack() as stack:
            if mode == "bwrap":
                seccomp = stack.enter_context(_seccomp_fd())
                cmd = _bwrap_args(tmpfs_bytes, seccomp) + [_PYTHON, "-I", "-S", script]
                cwd, env, pass_fds = "/", {}, [seccomp]
                if os.geteuid() == 0:
                    self.lease = UidLease()
                job = {
                    **job,
                    "weak": False,
                    "workdir": "/tmp",
                    "drop_to": self.lease.uid if self.lease is not None else None,
                }
            else:
                self.workdir = tempfile.mkdtemp(prefix="scalerl-sandbox-")
                cmd = [_PYTHON, "-I", "-S", script]
                cwd, env = self.workdir, {**_ENV, "HOME": self.workdir, "TMPDIR": self.workdir}
                pass_fds = []
                job = {**job, "weak": True, "workdir": self.workdir, "drop_to": None}
            try:
                self.proc = subprocess.Popen(
                    cmd + [owner_tag()],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                    pass_fds=pass_fds,
                )
            except BaseException:
                if self.lease is not None:
                    self.lease.release()
                raise
        # Both pipes exist: they were asked for above.
        self.stdin = cast(IO[bytes], self.proc.stdin)
        self.stdout = cast(IO[bytes], self.proc.stdout)
        os.set_blocking(self.stdin.fileno(), False)
        # poll, not select: a trainer may hold more than 1024 descriptors
        self.writable, self.readable = select.poll(), select.poll()
        self.writable.register(self.stdin.fileno(), select.POLLOUT)
        self.readable.register(self.stdout.fileno(), select.POLLIN)
        self.buf, self.scanned, self.broken = bytearray(), 0, False
        if not self.send({**job, "site_packages": list(_SITE_PACKAGES)}, deadline):
            self.broken = True

    def send(self, msg: dict, deadline: float) -> bool:
        """Write one message by `deadline`; False if the process did not take it."""
        data = memoryview(_inside.dumps(msg))
        fd = self.stdin.fileno()
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.writable.poll(math.ceil(remaining * 1000)):
                return False
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                continue
            except OSError:
                return False
        return True

    def read(self, deadline: float) -> Optional[dict]:
        """The next message, or None (and `broken` from then on: a late answer must never be
        taken for the answer to a later request)."""
        fd = self.stdout.fileno()
        while not self.broken:
            end = self.buf.find(b"\n", self.scanned)
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[: end + 1]
                self.scanned = 0
                try:
                    return _inside.loads(line, self.max_line)
                except _inside.WireError:
                    break
            self.scanned = len(self.buf)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.scanned > self.max_line:
                break
            if not self.readable.poll(math.ceil(remaining * 1000)):
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            self.buf += chunk
        self.broken = True
        return None

    def request(self, msg: dict, deadline: float) -> Optional[dict]:
        if self.broken or not self.send(msg, deadline):
            self.broken = True
            return None
        return self.read(deadline)

    def close(self) -> None:
        """Kill the process and everything it started; remove its directory; give its uid back.
        In the bwrap mode killing bubblewrap ends its PID namespace; in the weak mode the runner
        is a subreaper, so every descendant is in its tree, and the tree is killed from the
        leaves' side until it is empty."""
        if self.mode == "weak":
            for _ in range(100):
                pids = _descendants(self.proc.pid)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.001)
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # before the reap: the id is still ours
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILLed: only the kernel waits
            self.proc.wait(timeout=5.0)
        reaped = self.proc.returncode is not None
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        if self.workdir is not None:
            _remove_tree(self.workdir)
        if self.lease is not None and reaped:  # else its uid stays leased while it lives
            self.lease.release()
