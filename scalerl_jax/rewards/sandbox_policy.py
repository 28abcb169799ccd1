"""What each strong-mode sandbox may be: an identity of its own, and the system calls it may make.

Identity: started as root, each sandbox drops to a uid of its own from `UID_RANGE`, leased by
an flock per uid, so concurrent rollouts never share per-uid kernel state; started as a user,
each sandbox has a user namespace of its own. System calls: a seccomp filter (built with
libseccomp's Python bindings, exported as BPF once per process) refuses with EPERM what a
scored program never needs. The lists: docs/rewards.md, "Code rewards".
"""

from __future__ import annotations

import errno
import fcntl
import functools
import importlib
import os
from typing import Optional
import random
import tempfile

UID_RANGE = range(0x70000000, 0x70000000 + 4096)  # above systemd's container range, below 2**31
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NEW_FLAGS = (0x80, 0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 1 << 30)
DENIED = {  # refused with EPERM, by group
    "namespaces": "unshare setns",
    "keyrings, per-uid state that outlives a sandbox": "keyctl add_key request_key",
    "other processes": "ptrace process_vm_readv process_vm_writev pidfd_getfd",
    "mounts": "mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount "
    "fspick mount_setattr",
    "kernel surface no test program uses": "bpf perf_event_open userfaultfd io_uring_setup "
    "io_uring_enter io_uring_register kexec_load kexec_file_load init_module finit_module "
    "delete_module reboot swapon swapoff acct quotactl quotactl_fd syslog name_to_handle_at "
    "open_by_handle_at lookup_dcookie fanotify_init iopl ioperm modify_ldt uselib vhangup "
    "settimeofday clock_settime clock_adjtime adjtimex personality",
    "memory outside every limit": "memfd_create memfd_secret shmget msgget",
}


def _bindings():
    """libseccomp's own bindings (Debian: python3-seccomp), else pyseccomp (PyPI)."""
    try:
        return importlib.import_module("seccomp")
    except ImportError:
        return importlib.import_module("pyseccomp")


@functools.lru_cache(maxsize=None)
def seccomp_bpf() -> bytes:
    """The filter as a BPF program for `bwrap --seccomp FD`. RuntimeError (saying what to
    install) when libseccomp or its Python bindings are missing."""
    try:
        sc = _bindings()
    except (ImportError, RuntimeError, OSError) as e:
        raise RuntimeError(
            f"no libseccomp Python bindings ({type(e).__name__}: {e}): pip install pyseccomp "
            "(needs libseccomp2), or apt-get install python3-seccomp"
        ) from None
    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    for name in " ".join(DENIED.values()).split():
        try:
            f.add_rule(deny, name)
        except (ValueError, OSError, RuntimeError):  # not a system call of this architecture
            continue
    for flag in CLONE_NEW_FLAGS:
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


class UidLease:
    """A uid of `UID_RANGE` that no other live sandbox of this host holds (see the module
    docstring); `release` when the sandbox is gone."""

    def __init__(self, lock_dir: str = os.path.join(tempfile.gettempdir(), ".scalerl-uids")):
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        start = random.randrange(len(UID_RANGE))  # spread: a just-freed uid is rarely reused
        for k in range(len(UID_RANGE)):
            i = (start + k) % len(UID_RANGE)
            path = os.path.join(lock_dir, str(i))
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid = UID_RANGE[i]
            self._fd: Optional[int] = fd
            return
        raise RuntimeError(f"all {len(UID_RANGE)} sandbox uids are in use ({lock_dir})")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
