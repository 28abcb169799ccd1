"""Comparing recipes (the paper's rule) and checking extrapolation on a run's own data.

Comparison rule (paper): seeds move A by up to +-0.015, so 0.02 is the margin. If two fits' A
differ by more, the higher A is the better ceiling. If they agree within it, refit both with A
held at their average and compare B: the higher B reaches the shared ceiling with less compute.

Extrapolation (paper: fit on half the budget, predict the rest): fit on compute <= fraction *
(largest compute), predict the held-out points, report the errors and how many fall inside the
bootstrap prediction band.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Union

import numpy as np

from scalerl_jax.scaling.bootstrap import Bootstrap, bootstrap_fit
from scalerl_jax.scaling.fit import (Curve, FitFailure, FitResult, FitSpec, SigmoidFit, fit_curve,
                                     window_mask)

A_MARGIN = 0.02


@dataclasses.dataclass(frozen=True)
class Comparison:
    names: tuple  # (a, b)
    A: tuple  # each fit's own A
    rule: str  # "A" (ceilings differ) or "B" (same ceiling, compare efficiency)
    A_shared: Optional[float] = None
    B_refit: Optional[tuple] = None  # B of each curve refitted at A_shared
    winner: Optional[str] = None  # None: undecided (a refit failed)
    summary: str = ""


def compare_fits(curve_a: Curve, curve_b: Curve, spec: FitSpec = FitSpec(), *,
                 fit_a: Optional[FitResult] = None, fit_b: Optional[FitResult] = None,
                 margin: float = A_MARGIN) -> Union[Comparison, FitFailure]:
    fit_a = fit_a if fit_a is not None else fit_curve(curve_a, spec)
    fit_b = fit_b if fit_b is not None else fit_curve(curve_b, spec)
    names = (curve_a.name, curve_b.name)
    for name, fit in zip(names, (fit_a, fit_b)):
        if not fit.ok:
            return FitFailure(reason=f"cannot compare {names[0]} with {names[1]}: {name} has no "
                                     f"fit ({fit.reason})", n_points=fit.n_points)
    As = (fit_a.A, fit_b.A)
    gap = As[0] - As[1]
    if abs(gap) > margin:
        winner = names[0] if gap > 0 else names[1]
        return Comparison(names=names, A=As, rule="A", winner=winner,
                          summary=f"A differs by {abs(gap):.3f} > {margin}: {winner} has the "
                                  f"higher ceiling ({max(As):.3f} vs {min(As):.3f})")
    shared = 0.5 * (As[0] + As[1])
    refits = [fit_curve(c, spec, A=shared) for c in (curve_a, curve_b)]
    for name, fit in zip(names, refits):
        if not fit.ok:
            return Comparison(names=names, A=As, rule="B", A_shared=shared,
                              summary=f"A agree within {margin}; refit of {name} at A = "
                                      f"{shared:.3f} failed: {fit.reason}")
    Bs = (refits[0].B, refits[1].B)
    winner = names[0] if Bs[0] > Bs[1] else names[1]
    return Comparison(names=names, A=As, rule="B", A_shared=shared, B_refit=Bs, winner=winner,
                      summary=f"A agree within {margin} (|dA| = {abs(gap):.3f}); at shared A = "
                              f"{shared:.3f}, B = {Bs[0]:.2f} vs {Bs[1]:.2f}: {winner} is more "
                              f"compute-efficient")


@dataclasses.dataclass(frozen=True)
class Extrapolation:
    split: float  # compute up to which the fit saw data
    fit: SigmoidFit
    n_heldout: int
    rmse: float  # on the held-out points
    max_abs_err: float
    final_err: float  # prediction minus observation at the largest compute
    coverage: Optional[float]  # held-out points inside the prediction band
    band: Optional[Bootstrap]


def extrapolate(curve: Curve, spec: FitSpec = FitSpec(), *, fraction: float = 0.5,
                n_boot: int = 0, band_x: Optional[np.ndarray] = None,
                seed: int = 0) -> Union[Extrapolation, FitFailure]:
    if not 0 < fraction < 1:
        raise ValueError(f"extrapolate: fraction={fraction} must be in (0, 1)")
    window = window_mask(curve, spec)
    if not window.any():
        return FitFailure(reason="no points in the fit window", n_points=0)
    split = fraction * float(curve.x[window].max())
    if split <= spec.fit_start:
        return FitFailure(reason=f"split at {split:.4g} ({fraction:g} of the largest compute) "
                                 f"is not past fit_start = {spec.fit_start:.4g}", n_points=0)
    part = dataclasses.replace(spec, fit_end=split)
    heldout = (curve.x > split) & np.isfinite(curve.y)
    if heldout.sum() < 1:
        return FitFailure(reason="no held-out points beyond the split", n_points=0)
    fit = fit_curve(curve, part)
    if not fit.ok:
        return FitFailure(reason=f"fit on compute <= {split:.4g}: {fit.reason}",
                          n_points=fit.n_points)
    xs, ys = curve.x[heldout], curve.y[heldout]
    err = fit.predict(xs) - ys
    last = np.flatnonzero(xs == xs.max())
    band, coverage = None, None
    if n_boot:
        if band_x is None:
            band_x = np.geomspace(fit.x_range[0], xs.max(), 100)
        band = bootstrap_fit(curve, part, fit, n_boot=n_boot, band_x=band_x, noise=True,
                             seed=seed)
        lo = np.interp(np.log(xs), np.log(band.band_x), band.band_lo)
        hi = np.interp(np.log(xs), np.log(band.band_x), band.band_hi)
        coverage = float(np.mean((ys >= lo) & (ys <= hi)))
    return Extrapolation(split=split, fit=fit, n_heldout=int(heldout.sum()),
                         rmse=float(np.sqrt(np.mean(err ** 2))),
                         max_abs_err=float(np.abs(err).max()),
                         final_err=float(np.mean(err[last])), coverage=coverage, band=band)
