"""Score (completion, reference) pairs on a host worker pool with a per-item timeout.

A verifier is any `fn(completion: str, reference: str) -> bool`; one that raises or runs past
`timeout_s` scores as incorrect and is counted, and `score` returns on time whatever the
verifiers do. Threads (`processes=False`) abandon and replace a stuck call; processes
(`processes=True`, spawned children under a memory cap) are killed and restarted on timeout.
The two modes and their limits: docs/rewards.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import pickle
import queue
import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np

from scalerl_jax.interrupt import start_child
from scalerl_jax.rewards.pool_child import child_main as _child_main

Verifier = Callable[[str, str], bool]
_log = logging.getLogger(__name__)
DEFAULT_MEMORY_MB = 2048  # a child needs ~200 MiB for SymPy and math-verify; real answers ~50 more
MIN_MEMORY_MB = 256


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    rewards: np.ndarray  # float32 [n]: reward_correct / reward_incorrect
    correct: np.ndarray  # bool [n]
    num_timeouts: int
    num_errors: int
    seconds: float
    error_example: Optional[str] = None  # one verifier exception, for the log


class _Batch:
    """One `score` call's bookkeeping, so concurrent calls do not interfere."""

    __slots__ = ("remaining",)

    def __init__(self, n: int):
        self.remaining = n


class _Task:
    __slots__ = (
        "verifier",
        "completion",
        "reference",
        "batch",
        "started",
        "done",
        "correct",
        "error",
        "timed_out",
        "abandoned",
        "replaced",
        "thread",
    )

    def __init__(self, verifier, completion, reference, batch):
        self.verifier, self.completion, self.reference = verifier, completion, reference
        self.batch = batch
        self.started: Optional[float] = None
        self.done = self.correct = self.timed_out = self.abandoned = self.replaced = False
        self.error: Optional[str] = None
        self.thread: Optional[threading.Thread] = None


class RewardPool:
    """Worker pool for verifiers. Use as a context manager or call `close()`."""

    def __init__(
        self,
        num_workers: int = 8,
        timeout_s: float = 10.0,
        *,
        reward_correct: float = 1.0,
        reward_incorrect: float = -1.0,
        processes: bool = False,
        max_stuck_threads: Optional[int] = None,
        child_start_timeout_s: float = 120.0,
        memory_mb: Optional[int] = DEFAULT_MEMORY_MB,
    ):
        if num_workers <= 0:
            raise ValueError(f"RewardPool: num_workers={num_workers} must be > 0")
        if not timeout_s > 0:
            raise ValueError(f"RewardPool: timeout_s={timeout_s} must be > 0")
        if memory_mb is not None and (
            isinstance(memory_mb, bool)
            or not isinstance(memory_mb, int)
            or memory_mb < MIN_MEMORY_MB
        ):
            raise ValueError(
                f"RewardPool: memory_mb={memory_mb!r} must be None (no limit) or an "
                f"integer number of MiB >= {MIN_MEMORY_MB} (a verifier child needs "
                f"about 200 MiB to import SymPy)"
            )
        self.num_workers, self.timeout_s = num_workers, float(timeout_s)
        self.reward_correct, self.reward_incorrect = float(reward_correct), float(reward_incorrect)
        self.processes = processes
        self.max_stuck_threads = 4 * num_workers if max_stuck_threads is None else max_stuck_threads
        self.child_start_timeout_s = child_start_timeout_s
        self.memory_mb = memory_mb
        self._ctx = multiprocessing.get_context("spawn") if processes else None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._stuck = 0  # abandoned threads still inside a verifier call
        self._stuck_threads: set = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.total_items = self.total_timeouts = self.total_errors = 0
        started = [self._start_thread() for _ in range(num_workers)]
        for ready in started:  # children start in parallel; wait so that timing starts warm
            ready.wait(child_start_timeout_s)

    @property
    def stuck_threads(self) -> int:
        return self._stuck

    def score(self, verifier: Verifier, items: Sequence[tuple[str, str]]) -> ScoreResult:
        """Rewards for `items` = [(completion, reference), ...], in order. Thread-safe: calls
        from several threads share the workers (the not-started deadline assumes the workers
        are this call's, so concurrent calls with near-timeout verifiers may count extra
        timeouts)."""
        if self._closed:
            raise RuntimeError("RewardPool.score called after close()")
        if self.processes:
            try:
                pickle.dumps(verifier)
            except Exception as e:
                raise TypeError(
                    f"RewardPool(processes=True) needs a picklable verifier, got {verifier!r}: {e}"
                ) from e
        t0 = time.monotonic()
        batch = _Batch(len(items))
        tasks = [_Task(verifier, c, r, batch) for c, r in items]
        call_deadline = t0 + self.timeout_s * (math.ceil(len(tasks) / self.num_workers) + 1)
        poll = min(0.05, self.timeout_s / 10)
        for task in tasks:
            self._queue.put(task)
        with self._cond:
            while batch.remaining > 0:
                self._cond.wait(timeout=poll)
                if not self.processes:  # process workers enforce their own deadlines
                    self._expire(tasks, time.monotonic(), call_deadline)
        correct = np.array([t.done and t.correct for t in tasks], dtype=bool)
        timeouts = sum(t.timed_out for t in tasks)
        errors = [t.error for t in tasks if t.error is not None]
        with self._cond:
            self.total_items += len(tasks)
            self.total_timeouts += timeouts
            self.total_errors += len(errors)
        rewards = np.where(correct, self.reward_correct, self.reward_incorrect).astype(np.float32)
        return ScoreResult(
            rewards,
            correct,
            timeouts,
            len(errors),
            time.monotonic() - t0,
            errors[0] if errors else None,
        )

    def close(self) -> None:
        """Stop idle workers and their child processes; stuck threads are daemons and are left."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + 5.0
        for thread in self._threads:
            if thread not in self._stuck_threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------- internals
    def _start_thread(self) -> threading.Event:
        ready = threading.Event()
        if self.processes:
            thread = threading.Thread(
                target=self._process_worker, args=(ready,), daemon=True, name="reward-worker"
            )
        else:
            thread = threading.Thread(target=self._thread_worker, daemon=True, name="reward-worker")
            ready.set()
        self._threads.append(thread)
        thread.start()
        return ready

    def _expire(self, tasks: list[_Task], now: float, call_deadline: float) -> None:
        """Thread mode, lock held: time out overdue items; replace the threads stuck in them."""
        for task in tasks:
            if task.done or task.abandoned:
                continue
            started = task.started
            running = started is not None
            if started is not None and now - started <= self.timeout_s:
                continue
            if not running and now <= call_deadline:
                continue
            task.abandoned = task.timed_out = True
            task.batch.remaining -= 1
            if not running:
                continue
            self._stuck += 1
            self._stuck_threads.add(task.thread)
            if self._stuck <= self.max_stuck_threads:
                task.replaced = True
                self._start_thread()
            else:
                _log.warning(
                    "reward pool: %d stuck verifier threads (max_stuck_threads=%d); "
                    "running with fewer workers",
                    self._stuck,
                    self.max_stuck_threads,
                )

    def _claim(self, task: _Task) -> bool:
        with self._cond:
            if task.abandoned:
                return False
            task.started = time.monotonic()
            task.thread = threading.current_thread()
            return True

    def _finish(self, task: _Task, correct: bool, error: Optional[str], timed_out=False) -> bool:
        """Record a result; False when this thread must exit (it was replaced while stuck)."""
        with self._cond:
            if task.abandoned:
                self._stuck -= 1
                self._stuck_threads.discard(task.thread)
                return not task.replaced
            task.correct, task.error, task.timed_out = correct, error, timed_out
            task.done = True
            task.batch.remaining -= 1
            if task.batch.remaining == 0:
                self._cond.notify_all()
            return True

    def _thread_worker(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            if not self._claim(task):
                continue
            try:
                correct, error = bool(task.verifier(task.completion, task.reference)), None
            except BaseException as e:  # noqa: BLE001 - any verifier failure is a scored failure
                correct, error = False, _describe(e)
            if not self._finish(task, correct, error):
                return

    def _new_child(self) -> Optional["_Child"]:
        try:
            return _Child(self._ctx, self.child_start_timeout_s, self.memory_mb)
        except Exception as e:  # noqa: BLE001 - items score as errors; retried on the next one
            _log.warning("reward pool: verifier process failed to start: %s", e)
            return None

    def _process_worker(self, ready: threading.Event) -> None:
        child = self._new_child()
        ready.set()
        try:
            while True:
                task = self._queue.get()
                if task is None:
                    return
                if child is None:
                    child = self._new_child()
                self._claim(task)
                if child is None:
                    self._finish(task, False, "verifier process failed to start")
                    continue
                correct, error, timed_out, broken = child.run(
                    task, self.timeout_s, self.child_start_timeout_s
                )
                if broken:
                    child.kill()
                self._finish(task, correct, error, timed_out)
                if broken:  # restart now, overlapping other items, not when the next arrives
                    child = self._new_child()
        finally:
            if child is not None:
                child.kill()


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


class _Child:
    """One verifier process and its pipe. Protocol per item: parent sends (verifier,
    completion, reference); child answers "go" once the verifier is unpickled (its module
    imported), then ("ok", bool), ("err", message), or ("oom", message) after a MemoryError,
    when it exits."""

    def __init__(self, ctx, start_timeout_s: float, memory_mb: Optional[int]):
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(
            target=_child_main, args=(child_conn, memory_mb), daemon=True, name="reward-verifier"
        )
        start_child(self.proc)
        child_conn.close()
        try:
            reply = self.conn.recv() if self.conn.poll(start_timeout_s) else None
        except (EOFError, OSError):
            reply = None
        if reply != "ready":
            self.kill()
            why = reply[1] if isinstance(reply, tuple) else f"not ready within {start_timeout_s}s"
            raise RuntimeError(f"verifier process: {why}")

    def run(
        self, task: _Task, timeout_s: float, import_timeout_s: float
    ) -> tuple[bool, Optional[str], bool, bool]:
        """(correct, error, timed_out, broken): a broken child must be replaced."""
        try:
            self.conn.send((task.verifier, task.completion, task.reference))
            if not self.conn.poll(import_timeout_s):
                return False, None, True, True
            status = self.conn.recv()
            if status != "go":
                return False, str(status[1]), False, False
            if not self.conn.poll(timeout_s):
                return False, None, True, True
            status, value = self.conn.recv()
            if status == "ok":
                return bool(value), None, False, False
            return False, str(value), False, status == "oom"  # the child exits after a MemoryError
        except (EOFError, OSError, pickle.PickleError) as e:  # the child died mid-item
            return False, f"verifier process died: {_describe(e)}", False, True

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5.0)
        self.conn.close()
