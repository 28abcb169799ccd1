"""A progress line at least every 30 s while a process is alive, whatever it is doing.

A bar or a step line says nothing while no step ends: start-up, loading a model, compiling, the
first evaluation of a real model (many minutes on a CPU). So an entry point runs `heartbeat()`:
a daemon thread that, whenever no console line has appeared for `SCALERL_PROGRESS_INTERVAL`
seconds (default 30), logs what the process is doing, from the nested `phase(...)` blocks the
code is in: "rl step 3/10 > evaluation of step 3 > sampling: 120/512 completions (01:02, ETA
03:20)". It is a thread, not a hook in the loops, because the slowest phases are single native
calls (an XLA compilation) that run no Python in the main thread; compilation releases the GIL,
so the thread keeps its schedule. progress.py's console handler reports every line it prints
(`HEARTBEAT.printed`), so a heartbeat comes only after `interval` seconds of silence.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from typing import Callable, Iterator, Optional

from tqdm import tqdm

log = logging.getLogger(__name__)

ENV_INTERVAL = "SCALERL_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 30.0


def _clock(seconds: float) -> str:
    return tqdm.format_interval(max(seconds, 0.0))  # 01:02, 1:02:03


class Phase:
    """One thing the process is doing: a name, its start, and optionally a count of `unit`s done
    out of `total` (`update`) or a `detail()` string computed for each line. A context manager;
    `begin()` / `end()` for a phase that does not fit a block (`end` may be called twice)."""

    def __init__(
        self,
        owner: "Heartbeat",
        name: str,
        total: Optional[int] = None,
        unit: str = "",
        detail: Optional[Callable[[], str]] = None,
        announce: bool = False,
    ):
        self.owner, self.name, self.total, self.unit, self.detail = owner, name, total, unit, detail
        self.announce = announce
        self.done = 0
        self.start = time.monotonic()
        self._first: Optional[tuple[float, int]] = None  # (time, count) of the first update

    def update(self, done: int) -> None:
        self.done = int(done)
        if self._first is None and self.done > 0:
            self._first = (time.monotonic(), self.done)

    def begin(self) -> "Phase":
        self.start = time.monotonic()
        self.owner._push(self)
        if self.announce:
            log.info("%s ...", self.owner.line(timing=False))
        return self

    def end(self) -> None:
        self.owner._pop(self)

    def __enter__(self) -> "Phase":
        return self.begin()

    def __exit__(self, *exc) -> None:
        self.end()

    def describe(self, now: float) -> str:
        text, elapsed = self.name, now - self.start
        if self.total:
            text += f": {self.done}/{self.total} {self.unit}".rstrip()
        if self.detail is not None:
            try:
                extra = self.detail()
            except Exception as err:  # noqa: BLE001 - a progress line must never fail
                extra = f"({type(err).__name__})"
            text += f": {extra}" if extra else ""
        timing = _clock(elapsed)
        if self.total and 0 < self.done < self.total and self._first is not None:
            # The rate since the first update: what came before it includes compiling.
            t1, done1 = self._first
            if self.done > done1:
                left = (now - t1) * (self.total - self.done) / (self.done - done1)
                timing += f", ETA {_clock(left)}"
            else:
                timing += ", ETA after the next update (the first includes compiling)"
        return f"{text} ({timing})"


class Heartbeat:
    """Logs the current phases whenever no console line has appeared for `interval` seconds (see
    the module docstring). Phases nest; the line shows them outermost first. The phases are
    tracked whether or not the thread runs, so library code can always enter them."""

    def __init__(self):
        self.interval = DEFAULT_INTERVAL_S
        self.last_output = time.monotonic()
        self._phases: list[Phase] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def printed(self) -> None:
        """A console line just appeared: the next heartbeat is due `interval` from now."""
        self.last_output = time.monotonic()

    def phase(
        self,
        name: str,
        *,
        total: Optional[int] = None,
        unit: str = "",
        detail: Optional[Callable[[], str]] = None,
        announce: bool = False,
    ) -> Phase:
        """A phase to enter (`with`, or `begin()`); `announce` also logs its name when it
        begins (for phases that start something slow: loading a model, compiling)."""
        return Phase(self, name, total, unit, detail, announce)

    def _push(self, current: Phase) -> None:
        with self._lock:
            self._phases.append(current)

    def _pop(self, current: Phase) -> None:
        with self._lock:
            if current in self._phases:
                self._phases.remove(current)

    def line(self, now: Optional[float] = None, *, timing: bool = True) -> str:
        now = time.monotonic() if now is None else now
        with self._lock:
            phases = list(self._phases)
        if not phases:
            return "working"
        outer = [p.name for p in phases[:-1]]
        inner = phases[-1].describe(now) if timing else phases[-1].name
        return " > ".join(outer + [inner])

    def start(self, first_line: str, interval: Optional[float] = None) -> None:
        """Log `first_line` now and a heartbeat whenever `interval` seconds (default
        `interval_from_env()`) pass without a line."""
        if self._thread is not None:
            raise RuntimeError("Heartbeat.start: already running")
        self.interval = interval_from_env() if interval is None else float(interval)
        log.info("%s", first_line)
        self.printed()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="progress-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        # Wake often enough that a line is at most a quarter of the interval late.
        while not self._stop.wait(min(1.0, self.interval / 4)):
            now = time.monotonic()
            if now - self.last_output >= self.interval:
                log.info("%s", self.line(now))
                self.last_output = now  # also when logging is off: no line every wake-up


HEARTBEAT = Heartbeat()


def interval_from_env() -> float:
    """Seconds between heartbeat lines: SCALERL_PROGRESS_INTERVAL, default 30. A value that is
    not a number > 0 is reported and the default used (a display setting should not stop a
    run)."""
    text = os.environ.get(ENV_INTERVAL, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        log.warning(
            "%s=%r is not a number of seconds > 0; using %g", ENV_INTERVAL, text, DEFAULT_INTERVAL_S
        )
        return DEFAULT_INTERVAL_S
    return value


def phase(name: str, **kwargs) -> Phase:
    """`HEARTBEAT.phase(name, total=, unit=, detail=, announce=)`: while entered, heartbeat
    lines name it as what the process is doing."""
    return HEARTBEAT.phase(name, **kwargs)


@contextlib.contextmanager
def heartbeat(first_line: str, interval: Optional[float] = None) -> Iterator[Heartbeat]:
    """Run the heartbeat thread for the block (an entry point's whole life)."""
    HEARTBEAT.start(first_line, interval)
    try:
        yield HEARTBEAT
    finally:
        HEARTBEAT.stop()
