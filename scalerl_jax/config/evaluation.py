"""Held-out validation during a run (EvalConfig) and the online scaling-curve forecast made
at each validation (ForecastConfig)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from scalerl_jax.config.checks import _check, _positive


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out validation: mean@k pass rate every N steps (paper: 1,000 prompts, k=16, N=100),
    sampled like training (SamplerConfig's temperature / top-p / top-k)."""

    every_steps: int = 100
    k: int = 16
    num_prompts: int = 1000

    def __post_init__(self):
        _positive(
            "EvalConfig", every_steps=self.every_steps, k=self.k, num_prompts=self.num_prompts
        )


@dataclasses.dataclass(frozen=True)
class ForecastConfig:
    """Online forecast (scaling/forecast.py): at each evaluation the sigmoid is refitted on the
    validation points so far, in a background child process, and a `forecast` record is written.

    budget: the compute (in `x_key` units) to predict the pass rate at; None: the compute the
    run will have spent at its last step, extrapolated from the recent compute per step.
    target: a pass rate whose required compute is forecast; None: not forecast.
    n_boot: bootstrap resamples for the intervals (0: point estimates only).
    """

    enabled: bool = True
    budget: Optional[float] = None
    target: Optional[float] = None
    n_boot: int = 100
    x_key: str = "compute.device_hours"

    def __post_init__(self):
        c = "ForecastConfig"
        if self.budget is not None:
            _check(
                math.isfinite(self.budget) and self.budget > 0,
                c,
                "budget",
                self.budget,
                "must be a compute > 0 (in x_key units) or none (the run's projected end)",
            )
        if self.target is not None:
            _check(
                math.isfinite(self.target) and 0 < self.target < 1,
                c,
                "target",
                self.target,
                "must be a pass rate in (0, 1) or none",
            )
        _check(
            self.n_boot == 0 or self.n_boot >= 10,
            c,
            "n_boot",
            self.n_boot,
            "must be 0 (no intervals) or >= 10 resamples",
        )
        _check(bool(self.x_key), c, "x_key", self.x_key, "must be an eval-record key path")
