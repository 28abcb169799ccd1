"""The sampler driver: continuous batching over a prompt stream, groups, interruptions, and
in-flight weight updates, on top of `Engine`.

One loop, in a background thread (`start`) or the caller's (`run` / `step`): apply a pending
weight update, refill free slots (batched prefills per length bucket), one `generate` call,
then record the previous call's tokens per slot (dispatch ahead). A sample's tokens depend only
on (seed, ticket, sample index) and the params it saw. The loop's steps, dispatch ahead,
admission, reproducibility and interruptions: docs/sampler.md, "The driver's loop".
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import jax
import numpy as np

from scalerl_jax.config import SamplerConfig
from scalerl_jax.errors import UserError
from scalerl_jax.sampler.engine import Engine
from scalerl_jax.sampler.types import Completion, Group
from scalerl_jax.sampler.work import (
    DRIVER_COUNTS,
    GroupWork,
    Prompt,
    Sample,
    check_driver_args,
    driver_token_ids,
    prefill_buckets,
    sample_seed,
)

# Prompt, driver_token_ids, prefill_buckets and sample_seed live in work.py; callers import them
# from here too.
__all__ = [
    "Driver",
    "DriverError",
    "Prompt",
    "PromptTooLongError",
    "driver_token_ids",
    "prefill_buckets",
    "sample_seed",
]

log = logging.getLogger(__name__)


class PromptTooLongError(UserError, ValueError):
    """A prompt exceeds max_prefill_length and truncation is off."""


class DriverError(RuntimeError):
    """The driver thread failed on a bug; `__cause__` is the original exception. A UserError
    there (a prompt too long, ...) reaches the caller as itself."""


class Driver:
    """Continuous-batching sampler loop (docs/sampler.md, "The driver's loop").

    prompts: iterable of `Prompt` or (prompt_id, token ids[, metadata]) tuples.
    eos_ids / think_close_ids / phrase_ids: token ids, encoded by the caller's tokenizer
    (`driver_token_ids` or `Driver.for_tokenizer` encode cfg's strings); the last two only with
    interruptions on (else they would never be read, and are refused).
    continuous=False gives static batching (refill only when every slot is free): a baseline.
    dispatch_ahead: queue each generate call before reading the previous one (docs/sampler.md);
    default: when the engine decodes one step per call. False runs each call and its
    bookkeeping in lockstep.
    cfg: the driver-side fields (interruptions, think_min/max, answer_budget, max_new_tokens,
    truncate_long_prompts) are read from it; default `engine.cfg`. Everything compiled (slots,
    lengths, sampling: `sampler.engine.COMPILED_FIELDS`) is the engine's, so drivers with different
    policies can share one engine; a cfg that differs from the engine's in those fields is
    refused (ValueError naming the fields and both values), never silently overridden.
    """

    def __init__(
        self,
        engine: Engine,
        params,
        prompts: Iterable,
        *,
        group_size: int,
        eos_ids: Sequence[int],
        think_close_ids: Sequence[int] = (),
        phrase_ids: Sequence[int] = (),
        version: int = 0,
        on_group: Optional[Callable[[Group], None]] = None,
        max_queued_groups: int = 64,
        seed: int = 0,
        continuous: bool = True,
        min_prefill_bucket: int = 16,
        cfg: Optional[SamplerConfig] = None,
        admit: Optional[Callable[[int], bool]] = None,
        idle_wait_s: float = 0.002,
        dispatch_ahead: Optional[bool] = None,
    ):
        cfg = engine.cfg if cfg is None else cfg
        check_driver_args(engine, cfg, group_size, think_close_ids, phrase_ids)
        self._phrase = [int(t) for t in phrase_ids]
        self.engine, self.cfg, self.group_size = engine, cfg, group_size
        self._eos = frozenset(int(t) for t in eos_ids)
        self._close = [int(t) for t in think_close_ids]
        self._prompts = iter(prompts)
        self._buckets = prefill_buckets(engine.max_prefill_length, min_prefill_bucket)
        self._seed = int(seed)
        self._admit, self._idle_wait_s = admit, idle_wait_s
        self._count = 0  # prompts taken
        self._continuous = continuous
        self._on_group = on_group
        self._out: queue.Queue = queue.Queue(max_queued_groups)

        self._params = engine.load_params(params)
        self.version = int(version)
        self._pending: Optional[tuple[Any, int]] = None  # (params, version) not yet applied
        self._lock = threading.Lock()
        self._state = engine.init_decode_state()
        self._slots: list[Optional[Sample]] = [None] * engine.max_concurrent_decodes
        self._partial: Optional[GroupWork] = None
        self._exhausted = False
        self._dispatch_ahead = (
            engine.decode_steps_per_call == 1 if dispatch_ahead is None else bool(dispatch_ahead)
        )
        self._calls = 0  # generate calls dispatched
        # (ResultTokens on device, params version, call number)
        self._in_flight: Optional[tuple[Any, int, int]] = None

        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._error: Optional[BaseException] = None
        self._error_tb = None  # the driver thread's frames, kept for each re-raise
        self.stats: dict[str, float] = dict.fromkeys(DRIVER_COUNTS, 0)
        self.stats.update(time_generate=0.0, time_prefill=0.0, time_host=0.0, time_idle=0.0)

    @classmethod
    def for_tokenizer(
        cls,
        engine: Engine,
        params,
        prompts: Iterable,
        tokenizer,
        *,
        group_size: int,
        cfg: Optional[SamplerConfig] = None,
        **kwargs,
    ) -> "Driver":
        """A Driver whose eos / think-close / phrase ids are `driver_token_ids` of `cfg`
        (default `engine.cfg`) with `tokenizer`; other keywords go to `Driver`."""
        ids = driver_token_ids(
            engine.cfg if cfg is None else cfg,
            tokenizer,
            max_forced_tokens=engine.max_forced_tokens,
        )
        return cls(engine, params, prompts, group_size=group_size, cfg=cfg, **ids, **kwargs)

    # -- caller side ----------------------------------------------------------------------------
    def update_params(self, params, version: int) -> None:
        """Thread-safe: the new params take effect before the next generate call. Only the
        latest pending update is kept. Validated and placed on the sampler mesh here, in the
        caller's thread."""
        self._raise_if_failed()
        params = self.engine.load_params(params)
        with self._lock:
            self._pending = (params, int(version))

    def precompile(self) -> list[str]:
        """Compile, before the first step, every engine program this driver can call (each
        cache window of `generate`, each prefill bucket): `Engine.precompile`. Call it before
        `start` / `run` so that no compilation stalls a run's first steps. Returns the names of
        the newly compiled functions."""
        batched = [(self._batch_rows(t), t) for t in self._buckets if self._batch_rows(t) > 1]
        return self.engine.precompile(self._params, self._buckets, batched)

    def start(self) -> "Driver":
        if self._thread is not None:
            raise RuntimeError("Driver.start() called twice")
        self._thread = threading.Thread(
            target=self._thread_main, name="sampler-driver", daemon=True
        )
        self._thread.start()
        return self

    def get(self, timeout: Optional[float] = None) -> Optional[Group]:
        """Next completed group; None once every prompt is done. If the driver failed, raises
        its UserError as is, any other exception as a DriverError; TimeoutError after
        `timeout` seconds without a group."""
        if self._thread is None and not self._finished.is_set():
            raise RuntimeError("Driver.get() before start(): nothing would ever produce a group")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_if_failed()
            try:
                return self._out.get(timeout=0.05)
            except queue.Empty:
                pass
            if self._finished.is_set() and self._out.empty():
                self._raise_if_failed()
                return None
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"no group from the sampler driver within {timeout} s (stats: {self.stats})"
                )

    def __iter__(self):
        while (group := self.get()) is not None:
            yield group

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current step; samples in flight are dropped."""
        self._stop.set()
        self.join(timeout)

    def join(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"sampler driver thread still running after {timeout} s")
        self._raise_if_failed()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def queued(self) -> int:
        """Finished groups waiting in the output queue."""
        return self._out.qsize()

    @property
    def utilisation(self) -> float:
        """Useful tokens / slot-steps: the fraction of decode compute that produced tokens."""
        return self.stats["tokens"] / max(self.stats["slot_steps"], 1)

    def _raise_if_failed(self):
        if isinstance(self._error, UserError):
            # The user's error, for the caller to report in one line. Its traceback: the
            # caller's frames, then the driver thread's (reset, so repeated raises don't stack).
            raise self._error.with_traceback(self._error_tb)
        if self._error is not None:
            raise DriverError(f"sampler driver failed: {self._error!r}") from self._error

    # -- the loop -------------------------------------------------------------------------------
    def _thread_main(self):
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, not swallowed
            if not isinstance(e, UserError):  # a bug: its traceback, even if no caller asks
                log.exception("sampler driver failed")
            self._error_tb = e.__traceback__  # before _error: the caller polls _error
            self._error = e
        finally:
            self._finished.set()

    def run(self) -> None:
        """Loop until every prompt is done or `stop` is called."""
        while not self._stop.is_set() and self.step():
            pass
        self._finished.set()

    def step(self) -> bool:
        """One round (update, refill, generate, record). False once all work is done."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._params, self.version = pending
            self.stats["weight_updates"] += 1
        self._fill()
        live = [s for s in self._slots if s is not None]
        if not live and self._in_flight is None:
            if self._exhausted:
                return False  # _fill found no prompt left
            # Held back by admission (or an empty stream): wait for the trainer.
            t0 = time.perf_counter()
            self._stop.wait(self._idle_wait_s)
            self.stats["time_idle"] += time.perf_counter() - t0
            return True
        t0 = time.perf_counter()
        done, self._in_flight = self._in_flight, None
        if live:
            # Every live slot holds its prompt but the last token plus its emitted tokens (and
            # the steps of a call still in flight); inactive slots are not counted (the engine's
            # contract), so attention reads only the filled part.
            filled = max(len(s.group.tokens) - 1 + len(s.tokens) for s in live)
            if done is not None:
                filled += self.engine.decode_steps_per_call
            self._state, res = self.engine.generate(self._params, self._state, max_length=filled)
            self._in_flight = (res, self.version, self._calls)
            self._calls += 1
        if not self._dispatch_ahead:
            done, self._in_flight = self._in_flight, None
        if done is None:
            return True
        res, version, call = done
        res = jax.device_get(res)
        t1 = time.perf_counter()
        self._record(res, version, call)
        k, b = res.tokens.shape
        self.stats["generate_calls"] += 1
        self.stats["decode_steps"] += k
        self.stats["slot_steps"] += k * b
        self.stats["time_generate"] += t1 - t0
        self.stats["time_host"] += time.perf_counter() - t1
        return True

    def _fill(self):
        free = [i for i, s in enumerate(self._slots) if s is None]
        if not self._continuous and len(free) < len(self._slots):
            return
        # Assign the free slots first (the partly inserted group's remaining samples, then new
        # prompts), so that the new prompts can be prefilled together.
        plan = []
        while free:
            if self._partial is None:
                self._partial = self._next_group()
                if self._partial is None:
                    break
            g = self._partial
            take, free = free[: self.group_size - g.inserted], free[self.group_size - g.inserted :]
            plan.append((g, take))
            if g.inserted + len(take) < self.group_size:
                break  # no free slot left; the group stays partial
            self._partial = None
        self._prefill([g for g, _ in plan if g.prefix is None])
        inserts: dict[int, tuple] = {}  # one bulk_insert per prefix: (prefix, slots, rows, keys)
        for g, take in plan:
            seeds = [sample_seed(self._seed, g.ticket, g.inserted + i) for i in range(len(take))]
            _, slots, rows, keys = inserts.setdefault(id(g.prefix), (g.prefix, [], [], []))
            slots.extend(take)
            rows.extend([g.row] * len(take))
            keys.extend(seeds)
            cap = min(self.cfg.max_new_tokens, self.engine.max_target_length - len(g.tokens) + 1)
            for slot, words in zip(take, seeds):
                budget = None
                if self.cfg.interruptions:
                    budget = int(
                        np.random.default_rng(words).integers(
                            self.cfg.think_min, self.cfg.think_max + 1
                        )
                    )
                self._slots[slot] = Sample(g, g.inserted, cap, budget, first_call=self._calls)
                g.inserted += 1
            if g.inserted == self.group_size:
                g.prefix = None
        for prefix, slots, rows, keys in inserts.values():
            self._state = self.engine.bulk_insert(prefix, self._state, slots, keys=keys, rows=rows)

    def _next_group(self) -> Optional[GroupWork]:
        if self._exhausted or (self._admit is not None and not self._admit(self.version)):
            return None
        try:
            item = next(self._prompts)
        except StopIteration:
            self._exhausted = True
            return None
        if item is None:  # the stream has nothing right now
            return None
        prompt_id, tokens, metadata, ticket = (tuple(item) + ({}, None))[:4]
        ticket = self._count if ticket is None else int(ticket)
        self._count += 1
        tokens = np.asarray(tokens, np.int32).reshape(-1)
        limit = self.engine.max_prefill_length
        if len(tokens) == 0:
            raise ValueError(f"prompt {prompt_id!r} has no tokens")
        truncated = len(tokens) > limit
        if truncated:
            if not self.cfg.truncate_long_prompts:
                raise PromptTooLongError(
                    f"prompt {prompt_id!r} has {len(tokens)} tokens > max_prefill_length={limit}"
                    f" (set SamplerConfig.truncate_long_prompts=True to keep its last {limit})"
                )
            # Keep the end: it holds the question and the chat template's generation prompt.
            tokens = tokens[-limit:]
            self.stats["truncated_prompts"] += 1
        self.stats["prompts"] += 1
        return GroupWork(
            str(prompt_id),
            tokens,
            dict(metadata or {}),
            truncated,
            [None] * self.group_size,
            ticket,
            self.version,
        )

    def _batch_rows(self, t: int) -> int:
        """Rows of a batched prefill at bucket t: enough for every slot's group, within
        `prefill_batch_tokens`."""
        groups = -(-self.engine.max_concurrent_decodes // self.group_size)
        return max(1, min(groups, self.cfg.prefill_batch_tokens // t))

    def _prefill(self, groups: list[GroupWork]):
        """Prefill the new groups' prompts, by length bucket. The prompts of one bucket go
        through batched passes of `_batch_rows(t)` rows (padded) when they fill at least half
        of one: one [rows, T] pass instead of many [1, T] ones (x2 prefill tokens/s at 32 x 64
        tokens on a 2-core CPU, and fewer calls); the rest go one at a time, so that a refill
        of a slot or two never pays for a padded batch. Two programs per bucket in all, both
        precompiled."""
        by_bucket: dict[int, list[GroupWork]] = {}
        for g in groups:
            by_bucket.setdefault(next(b for b in self._buckets if b >= len(g.tokens)), []).append(g)
        t0 = time.perf_counter()
        for t, gs in by_bucket.items():
            n = self._batch_rows(t)
            for i in range(0, len(gs), n):
                part = gs[i : i + n]
                if len(part) > 1 and 2 * len(part) >= n:
                    self._prefill_part(part, n, t)
                else:
                    for g in part:
                        self._prefill_part([g], 1, t)
        self.stats["prefills"] += len(groups)
        self.stats["time_prefill"] += time.perf_counter() - t0

    def _prefill_part(self, part: list[GroupWork], rows: int, t: int):
        padded = np.zeros((rows, t), np.int32)
        lengths = np.ones((rows,), np.int32)  # padding rows: one token, never inserted
        for i, g in enumerate(part):
            padded[i, : len(g.tokens)] = g.tokens
            lengths[i] = len(g.tokens)
        prefix = self.engine.prefill_batch(self._params, padded, lengths)
        for i, g in enumerate(part):
            g.prefix, g.row = prefix, i
        self.stats["prefill_calls"] += 1

    def _record(self, res, version: int, call: int):
        k_steps = res.tokens.shape[0]
        for slot, smp in enumerate(self._slots):
            if smp is None or call < smp.first_call:  # freed, or decoded past its end / rewind
                continue
            for k in range(k_steps):
                if not res.valid[k, slot]:  # cache full: the cap normally ends it first
                    self._finish(slot, smp, "truncated")
                    break
                tok, forced = int(res.tokens[k, slot]), bool(res.forced[k, slot])
                smp.tokens.append(tok)
                smp.logprobs.append(res.logprobs[k, slot])
                smp.forced.append(forced)
                smp.versions.append(version)
                self.stats["tokens"] += 1
                self.stats["forced_tokens"] += forced
                n = len(smp.tokens)
                if (
                    self._close
                    and smp.think_open
                    and smp.tokens[-len(self._close) :] == self._close
                ):
                    smp.think_open = False
                if not forced and tok in self._eos:
                    self._finish(slot, smp, "interrupted" if smp.interrupted else "eos")
                    break
                if n >= smp.cap:
                    self._finish(slot, smp, "truncated")
                    break
                if smp.budget == n and smp.think_open and not smp.interrupted:
                    self._interrupt(slot, smp)
                    break

    def _interrupt(self, slot: int, smp: Sample):
        smp.interrupted = True
        smp.cap = min(smp.cap, len(smp.tokens) + len(self._phrase) + self.cfg.answer_budget)
        self.stats["interrupted"] += 1
        # Put the slot back at the budget (dropping whatever this call and any call in flight
        # decoded past it: a no-op when nothing did) and record only calls from the next on.
        length = len(smp.group.tokens) - 1 + len(smp.tokens)
        self._state = self.engine.rewind(self._state, slot, length, smp.tokens[-1])
        self._state = self.engine.force_tokens(self._state, slot, self._phrase)
        smp.first_call = self._calls

    def _finish(self, slot: int, smp: Sample, reason: str):
        g = smp.group
        g.completions[smp.index] = Completion(
            tokens=np.asarray(smp.tokens, np.int32),
            logprobs=np.asarray(smp.logprobs, np.float32),
            forced=np.asarray(smp.forced, bool),
            versions=np.asarray(smp.versions, np.int32),
            finish_reason=reason,
            interrupted=smp.interrupted,
        )
        self._slots[slot] = None
        self._state = self.engine.free_resource(self._state, slot)
        self.stats["completions"] += 1
        self.stats[f"finish_{reason}"] += 1
        g.done += 1
        if g.done == self.group_size:
            self.stats["groups"] += 1
            self._emit(
                Group(
                    g.prompt_id,
                    g.tokens,
                    g.completions,
                    g.metadata,
                    g.truncated,
                    ticket=g.ticket,
                    prefill_version=g.version,
                )
            )

    def _emit(self, group: Group):
        if self._on_group is not None:
            self._on_group(group)
            return
        if threading.current_thread() is not self._thread:  # run()/step() in the caller's thread
            try:
                self._out.put_nowait(group)
            except queue.Full:
                raise RuntimeError(
                    f"Driver output queue full ({self._out.maxsize} groups) while stepping in "
                    "the caller's thread: read groups with get() between steps, pass on_group, "
                    "or raise max_queued_groups"
                ) from None
            return
        while not self._stop.is_set():  # back-pressure: wait for the consumer, but stay stoppable
            try:
                self._out.put(group, timeout=0.1)
                return
            except queue.Full:
                pass
