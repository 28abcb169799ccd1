"""Online forecast: where a run is heading, refitted at every evaluation while it trains.

`forecast(points, ...)` is the pure part: the sigmoid fit so far, bootstrap intervals, the pass
rate expected at the budget (fit uncertainty plus evaluation noise) and the compute to reach a
target. `Forecaster` queues refits from a background thread to a niced CPU child process
(`ProcessRunner`, forecast_child.py), so the step never waits for a fit and the trainer's
thread writes the records. `is_stable`: A moved less than 0.02 over the last few forecasts.
The intervals and why a child process: docs/scaling.md, "Forecasts while training".
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.process
import os
import threading
import time
from multiprocessing.connection import Connection
from typing import Callable, Optional, Sequence

import numpy as np

from scalerl_jax import metrics
from scalerl_jax.interrupt import start_child
from scalerl_jax.scaling.bootstrap import bootstrap_fit
from scalerl_jax.scaling.compare import A_MARGIN
from scalerl_jax.scaling.fit import Curve, FitSpec, fit_curve

log = logging.getLogger(__name__)

STABLE_WINDOW = 3  # forecasts whose A must agree within A_MARGIN
BAND_REACH = 1e4  # the band (for compute-to-target) extends this far beyond the data or budget
BAND_POINTS = 300


def is_stable(
    history: Sequence[Optional[float]], margin: float = A_MARGIN, window: int = STABLE_WINDOW
) -> bool:
    """True when the last `window` forecasts all have an A (None: that forecast had no fit) and
    those A lie within `margin` of each other (max - min < margin)."""
    last = [a for a in list(history)[-window:] if a is not None and math.isfinite(a)]
    if len(last) < window:
        return False
    return max(last) - min(last) < margin


def required_compute(target: float, A: float, B: float, C_mid: float, R0: float) -> Optional[float]:
    """C with R(C) = target under the law; 0.0 when R0 already reaches it, None when A does
    not (the fitted curve never gets there)."""
    if target <= R0:
        return 0.0
    if target >= A:
        return None
    return float(C_mid * ((A - R0) / (target - R0) - 1.0) ** (-1.0 / B))


def _crossing(x: np.ndarray, r: np.ndarray, target: float) -> Optional[float]:
    """The first x where r reaches target (log-linear interpolation); None if it never does."""
    above = np.flatnonzero(r >= target)
    if not len(above):
        return None
    i = int(above[0])
    if i == 0:  # reached at the first x already (the band starts at the first fitted point)
        return float(x[0])
    u0, u1 = np.log(x[i - 1]), np.log(x[i])
    t = (target - r[i - 1]) / (r[i] - r[i - 1])
    return float(np.exp(u0 + t * (u1 - u0)))


def blank(
    *, x_key: str, budget: Optional[float], target: Optional[float], reason: Optional[str] = None
) -> dict:
    """Every forecast field, with no values yet (`reason`: why not)."""
    out: dict = {
        "ok": False,
        "reason": reason,
        "x_key": x_key,
        "n_points": 0,
        "x_max": None,
        "interval": None,
    }
    for name in ("A", "B", "C_mid"):
        out.update({name: None, f"{name}_lo": None, f"{name}_hi": None})
    out.update(
        R0=None,
        budget=budget,
        budget_lo=budget,
        budget_hi=budget,
        at_budget=None,
        at_budget_lo=None,
        at_budget_hi=None,
        at_budget_free_r0=None,
        target=target,
        compute_to_target=None,
        compute_to_target_lo=None,
        compute_to_target_hi=None,
    )
    return out


def forecast(
    x: np.ndarray,
    y: np.ndarray,
    *,
    budget: Optional[float],
    target: Optional[float],
    budget_range: Optional[tuple[float, float]] = None,
    n_boot: int = 100,
    spec: FitSpec = FitSpec(),
    seed: int = 0,
    x_key: str = "compute.device_hours",
) -> dict:
    """The forecast fields for validation points (x, y) (see README, `forecast` event).

    `budget_range` (lo, hi) around `budget`: where the budget itself is uncertain (projected,
    `projected_budget`), the interval at the budget holds the prediction intervals at both ends.
    Always returns the keys; values the data cannot support are None and `reason` says why.
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    out = blank(x_key=x_key, budget=budget, target=target)
    ends: list = []
    if budget is not None:
        lo_b, hi_b = budget_range if budget_range is not None else (budget, budget)
        if not 0 < lo_b <= budget <= hi_b:
            raise ValueError(f"forecast: budget_range={budget_range} must hold budget={budget} > 0")
        out.update(budget_lo=float(lo_b), budget_hi=float(hi_b))
        ends = [float(lo_b), float(hi_b)]
    positive = x[(x > 0) & np.isfinite(x)]
    out["x_max"] = float(positive.max()) if len(positive) else None
    curve = Curve("forecast", x, y, x_key=x_key)
    fit = fit_curve(curve, spec)
    out["n_points"] = fit.n_points
    if not fit.ok:
        out["reason"] = fit.reason
        return out
    out.update(ok=True, A=fit.A, B=fit.B, C_mid=fit.C_mid, R0=fit.R0)
    far = max(fit.x_range[1], budget or 0.0) * BAND_REACH
    band_x = np.geomspace(fit.x_range[0], far, BAND_POINTS)
    if budget is not None:
        band_x = np.unique(np.append(band_x, [budget, *ends]))
        out["at_budget"] = float(fit.predict(budget))
    boot = None
    if n_boot:
        boot = bootstrap_fit(curve, spec, fit, n_boot=n_boot, seed=seed, band_x=band_x)
        out["interval"] = boot.describe()
        for name, (lo, hi) in boot.intervals.items():
            out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
        if budget is not None and np.isfinite(boot.pred_lo).all():
            # The run's last evaluation is one noisy draw around the curve, so its interval is
            # the prediction band (fit uncertainty + evaluation noise), not the mean curve's.
            at = np.searchsorted(boot.band_x, ends)
            out["at_budget_lo"] = float(boot.pred_lo[at].min())
            out["at_budget_hi"] = float(boot.pred_hi[at].max())
            if spec.r0 == "measured":
                out.update(_free_r0_envelope(curve, spec, budget, ends, n_boot, seed, out))
    if target is not None:
        out.update(_to_target(target, fit, boot))
    return out


def _free_r0_envelope(
    curve, spec: FitSpec, budget: float, ends: list, n_boot: int, seed: int, out: dict
):
    """The interval at the budget widened to hold the free-R0 fit's prediction interval too.

    Whether the first evaluation lies on the curve the run goes on to follow is not knowable
    from the first points: the learning-rate warm-up and the switch from SFT to RL make the
    first steps slow, and with R0 pinned there a fit on few points comes out too steep, with an
    asymptote and an interval that are both too low (measured on the testbed, bench/README.md).
    The point forecast stays the measured-R0 fit (the paper's); the interval covers both."""
    free_spec = dataclasses.replace(spec, r0="free")
    fit = fit_curve(curve, free_spec)
    if not fit.ok:
        return {"at_budget_free_r0": None}
    boot = bootstrap_fit(curve, free_spec, fit, n_boot=n_boot, seed=seed, band_x=np.array(ends))
    if not np.isfinite(boot.pred_lo).all():
        return {"at_budget_free_r0": None}
    return {
        "at_budget_free_r0": float(fit.predict(budget)),
        "at_budget_lo": min(out["at_budget_lo"], float(boot.pred_lo.min())),
        "at_budget_hi": max(out["at_budget_hi"], float(boot.pred_hi.max())),
    }


def _to_target(target: float, fit, boot) -> dict:
    a_hi = fit.A if boot is None or "A" not in boot.intervals else boot.intervals["A"][1]
    if target >= max(a_hi, fit.A):  # beyond any plausible ceiling: no compute gets there
        return {}
    out = {"compute_to_target": required_compute(target, fit.A, fit.B, fit.C_mid, fit.R0)}
    if boot is not None and np.isfinite(boot.band_lo).all():
        # Pointwise quantiles of increasing curves increase; the running max guards the rare
        # resample with A < R0 (a decreasing curve) from making the crossing ambiguous.
        hi_edge = np.maximum.accumulate(boot.band_hi)
        lo_edge = np.maximum.accumulate(boot.band_lo)
        at_start = fit.R0 >= target
        out["compute_to_target_lo"] = 0.0 if at_start else _crossing(boot.band_x, hi_edge, target)
        out["compute_to_target_hi"] = 0.0 if at_start else _crossing(boot.band_x, lo_edge, target)
    return out


def projected_budget(steps, xs, total_steps: int) -> Optional[tuple[float, float, float]]:
    """(lo, mid, hi): the x the run will reach at `total_steps`, a range because RL lengthens
    completions, so a step's compute grows by an amount not known in advance. On the testbed
    the average since step 0 fell 12-24% short of a run's total at a quarter of it.

    * lo: the remaining steps at the recent compute per step (from the evaluations in the last
      third of the steps so far, else the one before): the rate stops growing now.
    * hi: the rate keeps growing along its linear trend (least squares over the evaluations in
      the last half of the steps so far, a rising trend only).
    * mid: their geometric mean, where the point forecast is made.

    Measured on 21 testbed runs (bench/README.md), as shares of each run's real total: at a
    quarter of its compute lo 0.88 on average (0.83-0.98), mid 0.99 (0.92-1.12), hi 1.11
    (0.98-1.32); at half lo 0.96, mid 0.99, hi 1.03. `steps` ascending, `xs` the x of each;
    None before step 1 or without compute yet."""
    steps, xs = np.asarray(steps, np.float64), np.asarray(xs, np.float64)
    if not len(steps) or total_steps <= 0:
        return None
    step, x_now = steps[-1], xs[-1]
    if step <= 0 or not x_now > 0:
        return None
    left = max(total_steps - step, 0.0)
    earlier = np.flatnonzero(steps < step)
    if not len(earlier):
        flat = float(x_now * total_steps / step)
        return flat, flat, flat
    recent = earlier[steps[earlier] >= step * 2 / 3]
    j = recent[0] if len(recent) else earlier[-1]
    rate = max((x_now - xs[j]) / (step - steps[j]), 0.0)
    lo = float(x_now + rate * left)
    # The trend: the compute per step between consecutive evaluations, at their midpoints.
    mid_steps = 0.5 * (steps[1:] + steps[:-1])
    rates = np.diff(xs) / np.diff(steps)
    window = mid_steps >= step / 2
    hi = lo
    if window.sum() >= 2:
        slope, icpt = np.polyfit(mid_steps[window], rates[window], 1)
        if slope > 0:
            hi = max(lo, float(x_now + (icpt + slope * step) * left + 0.5 * slope * left**2))
    return lo, min(max(math.sqrt(lo * hi), lo), hi), hi  # the clamp: rounding


def forecast_budget(
    budget: Optional[float], steps, xs, total_steps: int
) -> tuple[Optional[float], Optional[tuple[float, float]], str]:
    """(budget, budget_range, budget_source) of a refit: the configured budget when there is
    one, else the projection's geometric middle and its range (`projected_budget`)."""
    if budget is not None:
        return budget, None, "config"
    projection = projected_budget(steps, xs, total_steps)
    if projection is None:
        return None, None, "projected"
    lo, mid, hi = projection
    return mid, (lo, hi), "projected"


class ProcessRunner:
    """`forecast(x, y, **kwargs)` computed in a spawned child process (module doc), started
    at the first call and again after a crash. Called from one thread at a time."""

    def __init__(self, nice: int = 10, start_timeout_s: float = 600.0):
        self.nice, self.start_timeout_s = nice, start_timeout_s
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Optional[multiprocessing.process.BaseProcess] = None
        self._conn: Optional[Connection] = None

    def _start(self) -> None:
        from scalerl_jax.scaling.forecast_child import child_main

        conn, child_conn = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=child_main,
            args=(child_conn, self.nice, f"{__name__}:forecast"),
            daemon=True,
            name="scalerl-forecast",
        )
        self._conn, self._proc = conn, proc
        start_child(proc)
        child_conn.close()
        if not conn.poll(self.start_timeout_s) or conn.recv() != "ready":
            self.close()
            raise RuntimeError(f"the forecast child did not start in {self.start_timeout_s} s")

    def __call__(self, x, y, **kwargs) -> dict:
        if self._proc is None or not self._proc.is_alive() or self._conn is None:
            self._start()
        conn = self._conn
        assert conn is not None  # _start set it or raised
        try:
            conn.send((np.asarray(x), np.asarray(y), kwargs))
            status, value = conn.recv()
        except (EOFError, OSError, BrokenPipeError) as err:
            code = self._proc.exitcode if self._proc is not None else None
            self.close()
            raise RuntimeError(f"the forecast child exited (code {code})") from err
        if status != "ok":
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


@dataclasses.dataclass(frozen=True)
class _Job:
    step: int
    x: np.ndarray
    y: np.ndarray
    budget: Optional[float]
    budget_range: Optional[tuple[float, float]]
    budget_source: str  # "config" | "projected"


class Forecaster:
    """Refits from one background thread; `submit` never waits, `poll` hands back results.

    One job runs at a time. An evaluation that arrives while a refit is running waits as the
    pending job; a newer evaluation replaces a pending one (counted in `superseded`), so the
    forecast keeps up with the newest data however slow the fit is. `poll()` (trainer thread)
    returns the finished forecasts as record fields, with `stable` from the A of the forecasts
    so far and the running `superseded` count. `finish()` waits for the running and pending
    jobs and stops the thread; `close()` stops it without waiting (a fit in flight is dropped).

    `run(x, y, **kwargs)` does a refit: `forecast` in a child process (`ProcessRunner`) unless
    given. With enabled=False (not process 0, or forecasting off) every method is a no-op.
    """

    def __init__(
        self,
        *,
        budget: Optional[float] = None,
        target: Optional[float] = None,
        n_boot: int = 100,
        x_key: str = "compute.device_hours",
        total_steps: int = 0,
        points: Sequence[tuple] = (),
        history: Sequence[Optional[float]] = (),
        enabled: bool = True,
        spec: FitSpec = FitSpec(),
        run: Optional[Callable[..., dict]] = None,
    ):
        self.budget, self.target, self.n_boot = budget, target, n_boot
        self.x_key, self.total_steps, self.enabled, self.spec = x_key, total_steps, enabled, spec
        self._run = run if run is not None else ProcessRunner()
        self._points = {int(s): (float(x), float(y)) for s, x, y in points}  # step -> (x, y)
        self.history = list(history)  # A of each forecast written (None: no fit)
        self.superseded = 0
        self.submitted = 0
        self._lock = threading.Condition()
        self._pending: Optional[_Job] = None
        self._running = False
        self._done: list = []
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def for_run(cls, cfg, workdir: str, *, total_steps: int, enabled: bool) -> "Forecaster":
        """From a ForecastConfig; a resumed run's surviving eval points and forecasts are its
        starting data and stability history."""
        enabled = enabled and cfg.enabled
        points, history = [], []
        if enabled and os.path.exists(os.path.join(workdir, metrics.FILENAME)):
            log_ = metrics.read_metrics(workdir)
            for rec in log_.of("eval"):
                xy = _xy(rec, cfg.x_key)
                if xy is not None:
                    points.append((rec["step"], *xy))
            history = [rec.get("A") for rec in log_.of("forecast")]
        return cls(
            budget=cfg.budget,
            target=cfg.target,
            n_boot=cfg.n_boot,
            x_key=cfg.x_key,
            total_steps=total_steps,
            points=points,
            history=history,
            enabled=enabled,
        )

    def submit(self, eval_record: dict) -> None:
        """Queue a refit with this evaluation's point added (returns at once)."""
        if not self.enabled:
            return
        xy = _xy(eval_record, self.x_key)
        if xy is None:
            return
        step = int(eval_record["step"])
        self._points[step] = xy
        steps = sorted(self._points)
        x = np.array([self._points[s][0] for s in steps])
        y = np.array([self._points[s][1] for s in steps])
        job = _Job(step, x, y, *forecast_budget(self.budget, steps, x, self.total_steps))
        with self._lock:
            if self._pending is not None:
                self.superseded += 1
            self._pending = job
            self.submitted += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="forecast", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def poll(self) -> list[dict]:
        """The forecasts finished since the last call, oldest first, as record fields
        (`step` is the evaluation's)."""
        if not self.enabled:
            return []
        with self._lock:
            done, self._done = self._done, []
        out = []
        for step, fields in done:
            self.history.append(fields["A"] if fields.get("ok") else None)
            out.append(
                {
                    "step": step,
                    **fields,
                    "stable": is_stable(self.history),
                    "superseded": self.superseded,
                }
            )
        return out

    def finish(self, timeout: Optional[float] = None) -> list[dict]:
        """Wait (up to `timeout` s) for the running and pending refits, stop, return `poll()`."""
        if not self.enabled:
            return []
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._running or self._pending is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._lock.wait(left)
        self.close()
        return self.poll()

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._pending = None
            self._lock.notify_all()
        if isinstance(self._run, ProcessRunner):
            self._run.close()  # a refit in flight fails; the stopping worker drops it

    def __enter__(self) -> "Forecaster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _work(self) -> None:
        while True:
            with self._lock:
                while self._pending is None and not self._stop:
                    self._lock.wait()
                if self._stop:
                    return
                job, self._pending, self._running = self._pending, None, True
                assert job is not None  # the wait above ends on a job or on stop
            t0 = time.monotonic()
            try:
                fields = self._run(
                    job.x,
                    job.y,
                    budget=job.budget,
                    budget_range=job.budget_range,
                    target=self.target,
                    n_boot=self.n_boot,
                    spec=self.spec,
                    seed=job.step,
                    x_key=self.x_key,
                )
            except Exception as err:  # noqa: BLE001 - a forecast must never take the run down
                reason = f"{type(err).__name__}: {err}"
                if not self._stop:  # close() ending a refit in flight is not a failure
                    log.warning("forecast at step %d failed: %s", job.step, reason)
                fields = blank(
                    x_key=self.x_key, budget=job.budget, target=self.target, reason=reason
                )
            fields.update(budget_source=job.budget_source, fit_s=time.monotonic() - t0)
            with self._lock:
                self._done.append((job.step, fields))
                self._running = False
                self._lock.notify_all()


def _xy(record: dict, x_key: str) -> Optional[tuple]:
    try:
        x, y = metrics.get_path(record, x_key), record.get("pass_rate")
    except KeyError:
        return None
    if x is None or y is None:
        return None
    return float(x), float(y)
