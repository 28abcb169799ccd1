"""Stop signals answered within seconds, even while the main thread is inside a long native call.

Python runs signal handlers between bytecodes, so during an XLA compilation Ctrl-C seems to do
nothing. `Watchdog` hears the signal at once through `signal.set_wakeup_fd` in a daemon
thread, and acts only where the Python handlers cannot in time: it ends the process on a second
signal, or after the first when `can_exit()` says nothing would be lost (no step trained since
the last checkpoint), with `os._exit(128 + signal)` and one line saying what was done.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable, Optional, Union

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Watchdog:
    """Context manager: see the module docstring. Must be entered in the main thread, after the
    Python handlers for SIGINT / SIGTERM are installed (a signal without one never reaches the
    wake-up descriptor; the default SIGTERM action ends the process on its own anyway).

    can_exit(): True while ending the process loses nothing that a checkpoint would keep;
    `nothing_lost` (a text, or a function giving it at the time) says what, in the line of such
    an exit (e.g. "nothing trained since the last checkpoint, so nothing to save").
    acknowledged(): True once the main thread's handler has seen the signal (it then said what
    happens next itself).
    describe(): what the process is doing, for the lines (e.g. `progress.HEARTBEAT.line`).
    """

    def __init__(
        self,
        *,
        can_exit: Callable[[], bool],
        nothing_lost: Union[str, Callable[[], str]],
        acknowledged: Callable[[], bool] = lambda: False,
        describe: Callable[[], str] = lambda: "",
        grace_s: float = 3.0,
        second_grace_s: float = 2.0,
        exit_fn: Callable[[int], None] = os._exit,
    ):
        self.can_exit, self.acknowledged, self.describe = can_exit, acknowledged, describe
        self.nothing_lost = nothing_lost
        self.grace_s, self.second_grace_s, self._exit_fn = grace_s, second_grace_s, exit_fn
        self._closed = threading.Event()
        self._sockets: Optional[tuple[socket.socket, socket.socket]] = None
        self._previous_fd = -1
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "Watchdog":
        if threading.current_thread() is not threading.main_thread():
            return self  # set_wakeup_fd is main-thread only; the Python handlers still work
        read, write = socket.socketpair()
        write.setblocking(False)  # the C handler must never block
        self._sockets = (read, write)
        self._previous_fd = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(
            target=self._run, args=(read,), name="stop-watchdog", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        if self._sockets is None:
            return
        signal.set_wakeup_fd(self._previous_fd)
        read, write = self._sockets
        write.close()  # the reader sees end-of-file and returns
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        read.close()
        self._sockets = None

    def _run(self, read: socket.socket) -> None:
        first: Optional[int] = None
        deadline: Optional[float] = None
        while not self._closed.is_set():
            read.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.0))
            try:
                data = read.recv(64)
            except socket.timeout:
                data = None
            except OSError:
                return
            if data == b"" or self._closed.is_set():
                return
            if data is None:  # the first signal's grace is over and the process still runs
                deadline = None
                # A timeout needs a deadline, which is only set together with `first`.
                self._after_grace(first)  # type: ignore[arg-type]
                continue
            for signum in data:
                if signum not in STOP_SIGNALS:
                    continue
                if first is None:
                    first, deadline = signum, time.monotonic() + self.grace_s
                    continue
                if self._closed.wait(self.second_grace_s):
                    return
                self._end(
                    signum,
                    f"second stop signal ({signal.Signals(signum).name}): "
                    "exiting now without saving",
                )

    def _after_grace(self, signum: int) -> None:
        name = signal.Signals(signum).name
        doing = self.describe()
        if self.can_exit():
            lost = self.nothing_lost() if callable(self.nothing_lost) else self.nothing_lost
            self._end(
                signum,
                f"{name}: {lost}; exiting now instead of waiting for {doing or 'the current call'}",
            )
        elif not self.acknowledged():
            log.warning(
                "%s received while busy (%s): stopping with a checkpoint when the "
                "current step ends (a second signal exits at once, unsaved)",
                name,
                doing or "a long call",
            )

    def _end(self, signum: int, message: str) -> None:
        log.warning("%s", message)
        for stream in (sys.stderr, sys.stdout):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self._exit_fn(128 + int(signum))


def start_child(proc) -> None:
    """`proc.start()` (a multiprocessing Process) for a helper child that its parent stops,
    by closing its pipe or killing it. Ctrl-C in a terminal sends SIGINT to the whole process
    group; a child that heard it would print its own KeyboardInterrupt traceback. SIGINT is
    blocked in this thread while the child starts, so the child begins with it blocked (a
    signal mask survives fork and exec) until its entry point ignores it (rewards/pool_child.py,
    scaling/forecast_child.py); a Ctrl-C meanwhile stays pending here and reaches the parent
    after."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
