"""Uncertainty: bootstrap intervals for A, B, C_mid, bands for the curve, and per-seed fits.

Two methods, each call's resamples fitted in one batched fit: "ar1" (default), a parametric
residual bootstrap with AR(1) noise along each seed's evaluations, calibrated by refitting
simulated curves, with "basic" (bias-corrected) intervals; and "pairs", evaluation points
resampled within each seed (runs of `block` points). Hand-written: no library bootstraps a
nonlinear fit vmapped over thousands of resamples. Why AR(1) and how it is calibrated:
docs/scaling.md, "Intervals that hold their coverage".
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from scalerl_jax.scaling.fit import (
    Curve,
    FitSpec,
    SigmoidFit,
    padded,
    r0_value,
    result_from,
    window_mask,
)
from scalerl_jax.scaling.sigmoid import fit_sigmoid_batch, sigmoid_law

METHODS = ("ar1", "pairs")
RHO_GRID = np.linspace(0.0, 0.95, 20)  # AR(1) coefficients the calibration simulates
CALIBRATION_SIMS = 12  # simulated curves per grid value


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    intervals: dict  # "A", "B", "C_mid" -> (lo, hi)
    band_x: np.ndarray
    band_lo: np.ndarray
    band_hi: np.ndarray
    pred_lo: np.ndarray  # the band for one new evaluation at band_x (each resample's noise added)
    pred_hi: np.ndarray
    n_ok: int  # resamples with a finite fit
    n_boot: int
    level: float
    with_noise: bool  # band for new evaluations (True) or for the mean curve (False)
    method: str = "ar1"
    block: int = 1  # "pairs": evaluations per resampled run
    rho: Optional[float] = None  # "ar1": the noise's lag-1 autocorrelation (mean of the draws)

    def describe(self) -> str:
        """'AR(1) residual bootstrap, rho 0.62' / 'pairs bootstrap, block 4', for tables."""
        if self.method == "ar1":
            return f"AR(1) residual bootstrap (rho {self.rho:.2f}), {self.n_ok} resamples"
        return f"pairs bootstrap (block {self.block}), {self.n_ok} resamples"


def resample_weights(
    mask: np.ndarray, seed_ids: np.ndarray, n_boot: int, block: int, rng: np.random.Generator
) -> np.ndarray:
    """[n_boot, len(mask)] counts: each seed's window points resampled with replacement."""
    w = np.zeros((n_boot, len(mask)))
    for s in np.unique(seed_ids[mask]):
        idx = np.flatnonzero(mask & (seed_ids == s))
        n = len(idx)
        b = min(max(block, 1), n)
        starts = rng.integers(0, n - b + 1, size=(n_boot, -(-n // b)))
        picks = (starts[..., None] + np.arange(b)).reshape(n_boot, -1)[:, :n]
        np.add.at(w, (np.arange(n_boot)[:, None], idx[picks]), 1.0)
    return w


def ar1_noise(
    rng: np.random.Generator, rho: np.ndarray, sigma: np.ndarray, length: int
) -> np.ndarray:
    """[n, length] stationary AR(1) series, row i with coefficient rho[i] and sd sigma[i]."""
    rho, sigma = np.asarray(rho, np.float64), np.asarray(sigma, np.float64)
    z = rng.standard_normal((len(rho), length))
    e = np.empty_like(z)
    e[:, 0] = z[:, 0]
    innovation = np.sqrt(1.0 - rho**2)
    for t in range(1, length):
        e[:, t] = rho * e[:, t - 1] + innovation * z[:, t]
    return e * sigma[:, None]


def lag1_autocorrelation(resid: np.ndarray, chains: list) -> np.ndarray:
    """Pooled lag-1 autocorrelation of resid [n, m] along each chain (index arrays), rows apart."""
    num = den = 0.0
    for idx in chains:
        e = resid[:, idx] - resid[:, idx].mean(axis=1, keepdims=True)
        num = num + np.sum(e[:, 1:] * e[:, :-1], axis=1)
        den = den + np.sum(e**2, axis=1)
    return num / np.maximum(den, 1e-300)


class _Design:
    """What every resample shares: the padded x, the window, each seed's chain of window
    points in compute order, and how R0 and A are held."""

    def __init__(self, curve: Curve, spec: FitSpec, fit: SigmoidFit):
        self.curve, self.fit = curve, fit
        self.mask = window_mask(curve, spec)
        self.x, self.y, _ = padded(curve, self.mask)
        self.m = len(curve.x)
        seed = np.asarray(curve.seed)  # Curve fills it in (zeros for a single run)
        self.chains = [np.flatnonzero(self.mask & (seed == s)) for s in np.unique(seed[self.mask])]
        self.r0, _ = r0_value(curve, spec)
        self.r0_measured = spec.r0 == "measured"
        self.A = fit.A if "A" in fit.fixed else None
        self.spec = spec
        with np.errstate(divide="ignore", over="ignore"):  # x = 0 (the R0 point) is fine
            self.fitted = sigmoid_law(curve.x, fit.A, fit.B, fit.C_mid, fit.R0)

    def refit(self, y: np.ndarray, w: np.ndarray, r0: np.ndarray) -> dict:
        n = y.shape[0]
        return fit_sigmoid_batch(
            np.broadcast_to(self.x, (n, self.x.shape[1])),
            y,
            w,
            A=self.A,
            R0=r0,
            num_inits=self.spec.num_inits,
            check=False,
            **self.spec.optim(),
        )

    def simulate(self, rng, rho: np.ndarray, sigma: np.ndarray):
        """Curves = the fit + AR(1) noise along each seed's chain, whose first element is the
        seed's R0 evaluation when R0 is measured. Returns y [n, padded], w, R0 [n]."""
        n = len(rho)
        y = np.broadcast_to(self.y, (n, self.y.shape[1])).copy()
        w = np.zeros_like(y)
        r0_noise = np.zeros(n)
        lead = 1 if self.r0_measured else 0
        for idx in self.chains:
            e = ar1_noise(rng, rho, sigma, len(idx) + lead)
            y[:, idx] = self.fitted[idx] + e[:, lead:]
            w[:, idx] = 1.0
            if lead:
                r0_noise += e[:, 0] / len(self.chains)
        return y, w, np.full(n, self.r0) + r0_noise

    def residuals(self, y: np.ndarray, out: dict) -> np.ndarray:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            pred = sigmoid_law(
                self.x[:, : self.m],
                *(np.asarray(out[k])[:, None] for k in ("A", "B", "C_mid", "R0")),
            )
        return y[:, : self.m] - pred


def _noise_draws(design: _Design, n_boot: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """rho [n_boot] and sigma [n_boot] for the resamples, from the calibration (module doc)."""
    observed = design.curve.y[None, :] - design.fitted[None, :]
    r_obs = float(lag1_autocorrelation(observed, design.chains)[0])
    s_obs = float(np.sqrt(np.mean(observed[0, design.mask] ** 2)))
    if not s_obs > 0:
        return np.zeros(n_boot), np.zeros(n_boot)
    rho_sim = np.repeat(RHO_GRID, CALIBRATION_SIMS)
    y, w, r0 = design.simulate(rng, rho_sim, np.full(len(rho_sim), s_obs))
    out = design.refit(y, w, r0)
    resid = design.residuals(y, out)
    r_sim = lag1_autocorrelation(resid, design.chains)
    ratio = np.sqrt(np.mean(resid[:, design.mask] ** 2, axis=1)) / s_obs  # residual sd / noise sd
    ok = np.isfinite(r_sim) & np.isfinite(ratio) & (ratio > 0)
    loglik = np.full(len(RHO_GRID), -np.inf)
    for g in range(len(RHO_GRID)):
        r = r_sim[ok & (rho_sim == RHO_GRID[g])]
        if len(r) >= 3:
            sd = max(float(r.std()), 0.02)
            loglik[g] = -0.5 * ((r_obs - r.mean()) / sd) ** 2 - np.log(sd)
    if not np.isfinite(loglik).any():
        return np.zeros(n_boot), np.full(n_boot, s_obs)
    p = np.exp(loglik - loglik.max())
    cells = rng.choice(len(RHO_GRID), size=n_boot, p=p / p.sum())
    half = 0.5 * (RHO_GRID[1] - RHO_GRID[0])
    rho = np.clip(RHO_GRID[cells] + rng.uniform(-half, half, n_boot), 0.0, 0.97)
    # sigma: the observed spread over a residual/noise ratio drawn from the same grid cell
    sigma = np.empty(n_boot)
    for g in np.unique(cells):
        pool = ratio[ok & (rho_sim == RHO_GRID[g])]
        at = cells == g
        sigma[at] = s_obs / rng.choice(pool, size=int(at.sum()))
    return rho, sigma


def _basic(estimate: float, draws: np.ndarray, level: float, log: bool) -> tuple[float, float]:
    """Basic bootstrap interval (2 * estimate - quantiles), on a log scale for positive values."""
    q = (50 * (1 - level), 50 * (1 + level))
    if log:
        lo_q, hi_q = np.percentile(np.log(draws[draws > 0]), q)
        center = 2 * np.log(estimate)
        return float(np.exp(center - hi_q)), float(np.exp(center - lo_q))
    lo_q, hi_q = np.percentile(draws, q)
    return float(2 * estimate - hi_q), float(2 * estimate - lo_q)


def _refits(design: _Design, curve: Curve, method: str, n_boot: int, block: int, rng):
    """The `n_boot` refits, the noise scale of each and (ar1) the mean correlation drawn."""
    if method == "ar1":
        rho, sigma = _noise_draws(design, n_boot, rng)
        y, w, r0 = design.simulate(rng, rho, sigma)
        return design.refit(y, w, r0), sigma, float(rho.mean())
    w = np.zeros((n_boot, design.x.shape[1]))
    w[:, : design.m] = resample_weights(design.mask, np.asarray(curve.seed), n_boot, block, rng)
    out = design.refit(np.broadcast_to(design.y, w.shape), w, np.full(n_boot, design.r0))
    return out, out["rmse"], None


def bootstrap_fit(
    curve: Curve,
    spec: FitSpec,
    fit: SigmoidFit,
    *,
    n_boot: int = 200,
    level: float = 0.95,
    seed: int = 0,
    method: str = "ar1",
    block: int = 1,
    band_x: Optional[np.ndarray] = None,
    noise: bool = False,
) -> Bootstrap:
    """Intervals for A, B, C_mid and a band for the curve from `n_boot` refits (module doc).

    noise=True adds each resample's noise to its curve, giving a band for new evaluations (a
    prediction band) rather than for the mean curve; `pred_lo` / `pred_hi` are that band in
    either case.
    """
    if not 0 < level < 1 or n_boot < 10:
        raise ValueError(f"bootstrap: level={level} must be in (0, 1), n_boot={n_boot} >= 10")
    if method not in METHODS:
        raise ValueError(f"bootstrap: method={method!r} must be one of {METHODS}")
    if block < 1:
        raise ValueError(f"bootstrap: block={block} must be >= 1")
    rng = np.random.default_rng(seed)
    design = _Design(curve, spec, fit)
    out, spread, rho_mean = _refits(design, curve, method, n_boot, block, rng)
    ok = np.all([np.isfinite(out[k]) for k in ("A", "B", "C_mid", "R0")], axis=0)
    intervals = {}
    if ok.any():
        intervals["A"] = _basic(fit.A, out["A"][ok], level, log=False)
        intervals["B"] = _basic(fit.B, out["B"][ok], level, log=True)
        intervals["C_mid"] = _basic(fit.C_mid, out["C_mid"][ok], level, log=True)
    if band_x is None:
        band_x = np.geomspace(fit.x_range[0], fit.x_range[1], 100)
    band_x = np.asarray(band_x, np.float64)
    mean = sigmoid_law(band_x[None, :], *(out[k][ok][:, None] for k in ("A", "B", "C_mid", "R0")))
    # One draw per resample, shared along x: each x still gets the right marginal spread (the
    # band is pointwise) and the band's edges come out smooth.
    noisy = mean + rng.standard_normal((mean.shape[0], 1)) * spread[ok][:, None]
    lo_q, hi_q = 50 * (1 - level), 50 * (1 + level)
    if ok.any():
        band = noisy if noise else mean
        edges = [np.percentile(a, q, axis=0) for a in (band, noisy) for q in (lo_q, hi_q)]
    else:
        edges = [np.full(len(band_x), np.nan)] * 4
    return Bootstrap(
        intervals=intervals,
        band_x=band_x,
        band_lo=edges[0],
        band_hi=edges[1],
        pred_lo=edges[2],
        pred_hi=edges[3],
        n_ok=int(ok.sum()),
        n_boot=n_boot,
        level=level,
        with_noise=noise,
        method=method,
        block=block if method == "pairs" else 1,
        rho=rho_mean,
    )


def fit_seeds(curve: Curve, spec: FitSpec) -> dict:
    """Each seed of a pooled curve fitted on its own (one batched call): {seed: FitResult}.

    The spread of A across seeds is the paper's noise yardstick (three seeds: +-0.015).
    """
    seeds = curve.seeds
    mask = window_mask(curve, spec)
    x, y, _ = padded(curve, mask)
    m = len(curve.x)
    w = np.zeros((len(seeds), x.shape[1]))
    r0 = np.zeros(len(seeds))
    for i, s in enumerate(seeds):
        on = curve.seed == s
        w[i, :m] = mask & on
        first = np.flatnonzero(on & np.isfinite(curve.y))[:1]
        r0[i] = (
            (curve.y[first[0]] if len(first) else np.nan)
            if spec.r0 == "measured"
            else r0_value(curve, spec)[0]
        )
    out = fit_sigmoid_batch(
        np.broadcast_to(x, w.shape),
        np.broadcast_to(y, w.shape),
        w,
        R0=r0,
        num_inits=spec.num_inits,
        **spec.optim(),
    )
    _, mode = r0_value(curve, spec)
    results: dict = {}
    for i, s in enumerate(seeds):
        on = mask & (curve.seed == s)
        results[int(s)] = result_from(out, i, on, curve, mode)
    return results


def seed_spread(per_seed: dict) -> Optional[float]:
    """Half the range of A over the seeds that fitted (None with fewer than two)."""
    As = [f.A for f in per_seed.values() if f.ok]
    return 0.5 * (max(As) - min(As)) if len(As) >= 2 else None
