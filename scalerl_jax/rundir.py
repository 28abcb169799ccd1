"""Run-directory integrity: one live run per workdir, and a config that stays the run's config.

`lock_workdir` takes an exclusive flock on `WORKDIR/.lock` (a second run fails at once, naming
the holder; the kernel drops it when the holder dies), `check_config` refuses a config that
differs from `WORKDIR/config.json` (but for `steps` and `workdir`), and a command that fails
validation leaves the workdir as it was. Also the CRC32 file manifests that checkpoints are
verified with. The rules: docs/default-job.md; why the order matters: docs/architecture.md.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import zlib
from typing import Any, Optional, Sequence

from scalerl_jax.config import ConfigError
from scalerl_jax.errors import UserError

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
CONFIG_NAME = "config.json"
# Keys a resumed run may change: more steps, and the workdir's own spelling (a moved run dir).
RESUMABLE = ("steps", "workdir", "forecast")  # forecasting never changes the run itself
MAX_LISTED = 10  # differing keys listed in a ConfigMismatch message
MANIFEST = "scalerl_manifest.json"
_CHUNK = 4 << 20


class WorkdirInUseError(UserError, RuntimeError):
    """Another live process holds the workdir's lock; the message names it."""


class ConfigMismatch(ConfigError):
    """The command's config differs from the config.json of the run in the workdir."""


class WorkdirLock:
    """An exclusive lock on a workdir, held until `release` (or the process's death)."""

    def __init__(self, workdir: str, fd: int, created_dirs: list[str]):
        self.workdir = workdir
        self.path = os.path.join(workdir, LOCK_NAME)
        self._fd: Optional[int] = fd
        self._created_dirs = created_dirs  # deepest first
        self._entries_before = set(os.listdir(workdir))

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock and remove what this run created in the workdir that holds no data:
        the lock file, empty files and directories (e.g. the `checkpoints/` Orbax creates, an
        empty metrics.jsonl) and the workdir itself if `lock_workdir` created it and it ends
        empty. A command that failed before writing anything thus leaves no trace."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: docs/architecture.md
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        for name in set(os.listdir(self.workdir)) - self._entries_before:
            _remove_if_empty(os.path.join(self.workdir, name))
        for path in self._created_dirs:
            try:
                os.rmdir(path)
            except OSError:  # not empty: the run wrote into it, which is what we want to keep
                break

    def __enter__(self) -> "WorkdirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _remove_if_empty(path: str) -> None:
    """Remove `path` if it is an empty file, or a directory tree of empty files and dirs."""
    if os.path.islink(path):
        return
    if os.path.isfile(path):
        if os.path.getsize(path) == 0:
            os.remove(path)
        return
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            file = os.path.join(root, name)
            if not os.path.islink(file) and os.path.getsize(file) == 0:
                os.remove(file)
        try:
            os.rmdir(root)
        except OSError:  # holds data
            pass


def _makedirs(path: str) -> list[str]:
    """os.makedirs that returns the directories it created, deepest first."""
    missing = []
    head = path
    while head and not os.path.isdir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    os.makedirs(path, exist_ok=True)
    return missing


def _read_holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 1 << 16)
        holder = json.loads(data) if data.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "another process (it has not written its holder record yet)"
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("since"):
        text += f" since {holder['since']}"
    if holder.get("command"):
        text += f" (command: {holder['command']})"
    return text


def lock_workdir(workdir: str | os.PathLike) -> WorkdirLock:
    """Lock `workdir` for this process, creating it if needed; raise WorkdirInUseError at once
    when a live process holds it. Creates no file but `WORKDIR/.lock`."""
    workdir = os.path.abspath(os.fspath(workdir))
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(f"workdir {workdir} exists and is not a directory")
    created = _makedirs(workdir)
    path = os.path.join(workdir, LOCK_NAME)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_holder(fd)
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            for d in created:  # nothing of ours to keep (the holder created the lock file)
                try:
                    os.rmdir(d)
                except OSError:
                    break
            raise WorkdirInUseError(
                f"{workdir} is in use by {_describe(holder)}; stop that run or choose "
                "another --workdir"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and flock: lock anew

    previous = _read_holder(fd)
    if previous:
        log.warning(
            "workdir %s: taking over the lock of %s, which ended without releasing it (killed?)",
            workdir,
            _describe(previous),
        )
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)[:300],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    return WorkdirLock(workdir, fd, created)


# -- config guard ------------------------------------------------------------------------------
class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()


def _diff(old: Any, new: Any, prefix: str, out: list) -> None:
    sections = [x for x in (old, new) if isinstance(x, dict)]
    if sections and all(isinstance(x, dict) or x is _ABSENT for x in (old, new)):
        # A section present on one side only is listed key by key, like any other difference.
        old_d, new_d = (x if isinstance(x, dict) else {} for x in (old, new))
        for key in sorted(set(old_d) | set(new_d), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            _diff(old_d.get(key, _ABSENT), new_d.get(key, _ABSENT), path, out)
    elif old != new:
        out.append((prefix or "<root>", old, new))


def _ignored(path: str, ignore: Sequence[str]) -> bool:
    return any(path == key or path.startswith(key + ".") for key in ignore)


def config_diff(
    old: dict, new: dict, ignore: Sequence[str] = RESUMABLE, defaults: Optional[dict] = None
) -> list[tuple]:
    """[(dotted key, old value, new value)] where the configs differ, `ignore`d keys (and
    everything under them) left out; a key present on one side only shows as <absent>, except
    a key the old config predates whose new value is its default (`defaults`: {dotted key:
    default}, e.g. config.field_defaults()): a field added by an upgrade changes nothing."""
    out: list = []
    # JSON round trip so that tuples compare equal to the lists read back from config.json.
    _diff(old, json.loads(json.dumps(new)), "", out)
    defaults = defaults or {}
    return [
        d
        for d in out
        if not _ignored(d[0], ignore)
        and not (d[1] is _ABSENT and d[0] in defaults and defaults[d[0]] == d[2])
    ]


def check_config(
    workdir: str | os.PathLike,
    config: dict,
    *,
    allow_change: bool = False,
    ignore: Sequence[str] = RESUMABLE,
    defaults: Optional[dict] = None,
) -> list[tuple]:
    """Refuse (ConfigMismatch) a config that differs from WORKDIR/config.json in any key but
    `ignore`; returns the differences (empty for a fresh workdir or an equal config).

    With allow_change=True the differences are logged and returned instead: the caller then
    rewrites config.json (`write_config`) and records the change (e.g. in the `run` event).
    """
    path = os.path.join(os.fspath(workdir), CONFIG_NAME)
    if not os.path.exists(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except ValueError as err:
        if allow_change:
            log.warning(
                "%s is not valid JSON (%s); replacing it (--allow-config-change)", path, err
            )
            return [("<root>", "<unreadable>", "<new config>")]
        raise ConfigError(
            f"{path} is not valid JSON ({err}); restore it, choose another "
            "--workdir, or pass --allow-config-change to replace it"
        ) from None
    diffs = config_diff(old, config, ignore, defaults)
    if not diffs:
        return []
    listed = "; ".join(f"{key}: {o!r} -> {n!r}" for key, o, n in diffs[:MAX_LISTED])
    more = f"; and {len(diffs) - MAX_LISTED} more" if len(diffs) > MAX_LISTED else ""
    text = f"{len(diffs)} key(s) differ from {path}: {listed}{more}"
    if allow_change:
        log.warning("config change allowed (--allow-config-change): %s", text)
        return diffs
    raise ConfigMismatch(
        f"this command's config differs from the run in {workdir}: {text}. "
        "Resume with the same config, choose another --workdir, or pass "
        "--allow-config-change to continue the run with the new config"
    )


def write_config(workdir: str | os.PathLike, config: dict) -> str:
    """Write WORKDIR/config.json atomically (a crash leaves the old file or the new one)."""
    path = os.path.join(os.fspath(workdir), CONFIG_NAME)
    atomic_write(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path


def atomic_write(path: str, data: str | bytes) -> None:
    """Replace `path` with `data`: temp file in the same directory, fsync, rename, fsync dir."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- file manifests (checkpoint.py writes one per step and verifies it on restore) -------------
def _crc32(path: str) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def manifest_files(directory: str) -> list[str]:
    """Paths of the files under `directory` relative to it, its manifest (and temp files) left
    out."""
    out = []
    for root, _, files in os.walk(directory):
        out += [
            os.path.relpath(os.path.join(root, name), directory)
            for name in files
            if not (root == directory and name.startswith((MANIFEST, f".{MANIFEST}")))
        ]
    return sorted(out)


def write_manifest(directory: str) -> dict:
    """Hash every file under `directory` into DIRECTORY/scalerl_manifest.json, atomically: a
    manifest that exists is complete."""
    files = {}
    for rel in manifest_files(directory):
        path = os.path.join(directory, rel)
        files[rel] = {"size": os.path.getsize(path), "crc32": _crc32(path)}
    manifest = {"schema": 1, "algorithm": "crc32", "files": files}
    atomic_write(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify_manifest(directory: str) -> Optional[str]:
    """Why the files under `directory` disagree with its manifest (naming the file), or None
    when they agree or there is no manifest. Files the manifest does not list are not checked."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            files = json.load(f)["files"]
    except (ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST}: unreadable ({type(err).__name__}: {err})"
    for rel, want in sorted(files.items()):
        file = os.path.join(directory, rel)
        if not os.path.isfile(file):
            return f"{rel}: missing (listed in {MANIFEST})"
        size = os.path.getsize(file)
        if size != want["size"]:
            return f"{rel}: {size} bytes, {MANIFEST} says {want['size']}"
        crc = _crc32(file)
        if crc != want["crc32"]:
            return f"{rel}: crc32 {crc}, {MANIFEST} says {want['crc32']} (bytes changed)"
    return None
