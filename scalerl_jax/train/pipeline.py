"""Off-policy modes: PipelineRL-k, PPO-off-policy-k and sync, from one admission rule.

Version v is the params after v optimiser steps; step s trains version s - 1 on this host's
tickets [(s - 1) B, s B) in ticket order. The sampler, at version v, takes ticket i only while
i < limit(v) (pipeline: (v + k + 1) B, sync: (v + 1) B, ppo_off_policy: (v // k + 1) k B), so
staleness is bounded by admission: backpressure, never discarding. The rule, its metrics and
resume: docs/training.md, "Pipeline modes".
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import numpy as np

from scalerl_jax.config import ConfigError, PipelineConfig
from scalerl_jax.sampler.driver import Driver
from scalerl_jax.sampler.types import Group
from scalerl_jax.train.feed import PromptFeed


@dataclasses.dataclass(frozen=True)
class Schedule:
    mode: str  # pipeline | ppo_off_policy | sync
    k: int  # max_lag (pipeline) or updates per generation round (ppo_off_policy)
    batch: int  # prompts per step on this host

    @classmethod
    def from_config(cls, cfg: PipelineConfig, num_hosts: int = 1, host: int = 0) -> "Schedule":
        """Host `host`'s schedule: B / num_hosts prompts per step, the first B % num_hosts hosts
        one more (the paper's 48 prompts on a 32-host slice: 16 hosts sample 2, 16 sample 1)."""
        b, hosts = cfg.prompts_per_step, num_hosts
        if b < hosts:
            raise ConfigError(
                f"PipelineConfig.prompts_per_step={b} must be at least the number "
                f"of hosts ({hosts}): every host samples part of every step"
            )
        k = 0 if cfg.mode == "sync" else cfg.max_lag
        return cls(cfg.mode, k, b // hosts + (1 if host < b % hosts else 0))

    def limit(self, version: int) -> int:
        """Tickets below this may be admitted by a sampler holding params `version`."""
        if self.mode == "ppo_off_policy":
            return (version // self.k + 1) * self.k * self.batch
        return (version + self.k + 1) * self.batch

    def pushes(self, version: int) -> bool:
        """Whether the sampler gets the params of `version` (just produced by the trainer)."""
        return self.mode != "ppo_off_policy" or version % self.k == 0

    @property
    def max_staleness(self) -> int:
        return self.k - 1 if self.mode == "ppo_off_policy" else self.k

    @property
    def window(self) -> int:
        """The most groups that can be admitted but not yet consumed."""
        return (self.k + 1) * self.batch

    def tickets(self, step: int) -> range:
        return range((step - 1) * self.batch, step * self.batch)


class Rollouts:
    """The trainer's end of the sampler: the groups of each step, in ticket order, with the
    pipeline's health figures. Runs the driver in its background thread."""

    def __init__(self, driver: Driver, feed: PromptFeed, schedule: Schedule):
        self.driver, self.feed, self.schedule = driver, feed, schedule
        self._buffer: dict[int, Group] = {}
        self._last = time.monotonic()
        self._idle_seen = 0.0
        self.stale_total = 0

    def start(self) -> "Rollouts":
        self.driver.start()
        return self

    def take(self, step: int, version: int, timeout_s: float = 3600.0) -> tuple[list[Group], dict]:
        """The groups of `step` (waiting for them), trained at `version`, and per-step figures:
        wait time, staleness in versions (trainer version minus each group's oldest data),
        queue depth, sampler idle fraction since the previous call."""
        t0 = time.monotonic()
        wanted = self.schedule.tickets(step)
        while any(t not in self._buffer for t in wanted):
            group = self.driver.get(timeout=timeout_s)
            if group is None:
                raise RuntimeError("the sampler ran out of prompts")
            if group.ticket < wanted.start:
                raise RuntimeError(
                    f"group of ticket {group.ticket} arrived after its step "
                    f"(step {step} wants tickets {wanted.start}..{wanted.stop - 1})"
                )
            self._buffer[group.ticket] = group
        groups = [self._buffer.pop(t) for t in wanted]
        for g in groups:
            self.feed.consumed(g.ticket)
        now = time.monotonic()
        staleness = np.array([version - g.min_version for g in groups])
        kept = [g for g, s in zip(groups, staleness) if s <= self.schedule.max_staleness]
        stale = len(groups) - len(kept)
        self.stale_total += stale
        versions = {g.prefill_version for g in groups}
        versions.update(
            int(v) for g in groups for c in g.completions for v in np.unique(c.versions)
        )
        idle = self.driver.stats["time_idle"]
        span = max(now - self._last, 1e-9)
        figures = {
            "wait_s": now - t0,
            "staleness_min": int(staleness.min()),
            "staleness_mean": float(staleness.mean()),
            "staleness_max": int(staleness.max()),
            "data_versions": len(versions),
            "stale_groups": stale,
            "queue_depth": len(self._buffer) + self.driver.queued,
            "sampler_idle_frac": min((idle - self._idle_seen) / span, 1.0),
            "admitted_ahead": self.feed.issued - wanted.stop,
        }
        self._idle_seen, self._last = idle, now
        return kept, figures

    def publish(self, params_fn, version: int) -> Optional[object]:
        """Send the params of `version` to the sampler when the schedule says so; returns the
        sampler-side params sent (or None). `params_fn()` makes them (the weight sync), so no
        sync runs on steps that push nothing."""
        if not self.schedule.pushes(version):
            return None
        params = params_fn()
        self.driver.update_params(params, version)
        return params

    def stop(self) -> None:
        self.driver.stop()
