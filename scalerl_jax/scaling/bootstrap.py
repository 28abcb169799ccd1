"""Uncertainty: bootstrap intervals for A, B, C_mid, bands for the curve, and per-seed fits.

Resampling is by weights, so all resamples are one batched fit of the same padded arrays.
Resamples are drawn within each seed (a pooled multi-seed curve keeps its design). block > 1
draws runs of consecutive evaluations instead of single points, for noise that drifts between
neighbouring evaluations (training wobble) rather than being independent. R0, when measured or
given, stays fixed; A stays fixed when the fit held it fixed (comparison refits). Resamples are
always fitted with the continuous Optax fit, also for a grid-procedure fit.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from scalerl_jax.scaling.fit import (Curve, FitSpec, SigmoidFit, padded, r0_value, result_from,
                                     window_mask)
from scalerl_jax.scaling.sigmoid import fit_sigmoid_batch, sigmoid_law


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    intervals: dict  # "A", "B", "C_mid" -> (lo, hi)
    band_x: np.ndarray
    band_lo: np.ndarray
    band_hi: np.ndarray
    n_ok: int  # resamples with a finite fit
    n_boot: int
    level: float
    with_noise: bool  # band for new evaluations (True) or for the mean curve (False)


def resample_weights(mask: np.ndarray, seed_ids: np.ndarray, n_boot: int, block: int,
                     rng: np.random.Generator) -> np.ndarray:
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


def bootstrap_fit(curve: Curve, spec: FitSpec, fit: SigmoidFit, *, n_boot: int = 200,
                  level: float = 0.95, seed: int = 0, block: int = 1,
                  band_x: Optional[np.ndarray] = None, noise: bool = False) -> Bootstrap:
    """Percentile intervals and band from `n_boot` refits on resampled points (one batched call).

    noise=True adds each resample's residual noise to its curve, giving a band for new
    evaluations (a prediction band) rather than for the mean curve.
    """
    if not 0 < level < 1 or n_boot < 10:
        raise ValueError(f"bootstrap: level={level} must be in (0, 1), n_boot={n_boot} >= 10")
    rng = np.random.default_rng(seed)
    mask = window_mask(curve, spec)
    x, y, _ = padded(curve, mask)
    m = len(curve.x)
    w = np.zeros((n_boot, x.shape[1]))
    w[:, :m] = resample_weights(mask, curve.seed, n_boot, block, rng)
    r0, _ = r0_value(curve, spec)
    out = fit_sigmoid_batch(np.broadcast_to(x, w.shape), np.broadcast_to(y, w.shape), w,
                            A=fit.A if "A" in fit.fixed else None, R0=r0,
                            num_inits=spec.num_inits, check=False, **spec.optim())
    ok = np.all([np.isfinite(out[k]) for k in ("A", "B", "C_mid", "R0")], axis=0)
    lo_q, hi_q = 50 * (1 - level), 50 * (1 + level)
    intervals = {k: (float(np.percentile(out[k][ok], lo_q)), float(np.percentile(out[k][ok], hi_q)))
                 for k in ("A", "B", "C_mid")} if ok.any() else {}
    if band_x is None:
        band_x = np.geomspace(fit.x_range[0], fit.x_range[1], 100)
    band_x = np.asarray(band_x, np.float64)
    preds = sigmoid_law(band_x[None, :], *(out[k][ok][:, None] for k in ("A", "B", "C_mid", "R0")))
    if noise and ok.any():
        # One draw per resample, shared along x: each x still gets the right marginal spread
        # (the band is pointwise) and the band's edges come out smooth.
        preds = preds + rng.standard_normal((preds.shape[0], 1)) * out["rmse"][ok][:, None]
    empty = np.full(len(band_x), np.nan)
    return Bootstrap(
        intervals=intervals, band_x=band_x,
        band_lo=np.percentile(preds, lo_q, axis=0) if ok.any() else empty,
        band_hi=np.percentile(preds, hi_q, axis=0) if ok.any() else empty,
        n_ok=int(ok.sum()), n_boot=n_boot, level=level, with_noise=noise)


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
        r0[i] = (curve.y[first[0]] if len(first) else np.nan) if spec.r0 == "measured" \
            else r0_value(curve, spec)[0]
    out = fit_sigmoid_batch(np.broadcast_to(x, w.shape), np.broadcast_to(y, w.shape), w, R0=r0,
                            num_inits=spec.num_inits, **spec.optim())
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
