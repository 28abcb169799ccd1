"""Comparing recipes (the paper's rule) and checking extrapolation on a run's own data.

The rule: A apart by more than 0.02 (seeds move A by up to +-0.015) decides; otherwise both are
refitted with A at their average and the higher B wins. `decide` adds each run's bootstrap
interval and the winner's margin (half-widths in quadrature, B on a log scale). Extrapolation:
fit on compute <= fraction x the largest (or up to `split=fit_end`) and predict the rest, with
the share of held-out points inside the bootstrap band. See docs/scaling.md.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import numpy as np

from scalerl_jax.scaling.bootstrap import Bootstrap, bootstrap_fit
from scalerl_jax.scaling.fit import (
    Curve,
    FitFailure,
    FitResult,
    FitSpec,
    SigmoidFit,
    fit_curve,
    window_mask,
)

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
    refits: tuple = ()  # rule "B": both curves' fits at A_shared (for intervals of B)


def compare_fits(
    curve_a: Curve,
    curve_b: Curve,
    spec: FitSpec = FitSpec(),
    *,
    fit_a: Optional[FitResult] = None,
    fit_b: Optional[FitResult] = None,
    margin: float = A_MARGIN,
) -> Union[Comparison, FitFailure]:
    fit_a = fit_a if fit_a is not None else fit_curve(curve_a, spec)
    fit_b = fit_b if fit_b is not None else fit_curve(curve_b, spec)
    names = (curve_a.name, curve_b.name)
    for name, fit in zip(names, (fit_a, fit_b)):
        if not fit.ok:
            return FitFailure(
                reason=f"cannot compare {names[0]} with {names[1]}: {name} has no "
                f"fit ({fit.reason})",
                n_points=fit.n_points,
            )
    As = (fit_a.A, fit_b.A)  # type: ignore[union-attr]  # both ok: checked just above
    gap = As[0] - As[1]
    if abs(gap) > margin:
        winner = names[0] if gap > 0 else names[1]
        return Comparison(
            names=names,
            A=As,
            rule="A",
            winner=winner,
            summary=f"A differs by {abs(gap):.3f} > {margin}: {winner} has the "
            f"higher ceiling ({max(As):.3f} vs {min(As):.3f})",
        )
    shared = 0.5 * (As[0] + As[1])
    refits = [fit_curve(c, spec, A=shared) for c in (curve_a, curve_b)]
    for name, fit in zip(names, refits):
        if not fit.ok:
            return Comparison(
                names=names,
                A=As,
                rule="B",
                A_shared=shared,
                summary=f"A agree within {margin}; refit of {name} at A = "
                f"{shared:.3f} failed: {fit.reason}",
            )
    Bs = (refits[0].B, refits[1].B)  # type: ignore[union-attr]  # both ok: checked just above
    winner = names[0] if Bs[0] > Bs[1] else names[1]
    return Comparison(
        names=names,
        A=As,
        rule="B",
        A_shared=shared,
        B_refit=Bs,
        winner=winner,
        refits=tuple(refits),
        summary=f"A agree within {margin} (|dA| = {abs(gap):.3f}); at shared A = "
        f"{shared:.3f}, B = {Bs[0]:.2f} vs {Bs[1]:.2f}: {winner} is more "
        f"compute-efficient",
    )


@dataclasses.dataclass(frozen=True)
class Decision:
    """A comparison by the paper's rule with the intervals behind it (`decide`)."""

    comparison: Comparison
    param: str  # "A" or "B" (the refits' B at the shared A)
    values: tuple  # that parameter of each run
    intervals: tuple  # each run's (lo, hi), or None without a bootstrap
    margin: float  # A: winner's minus loser's; B: winner's over loser's
    margin_interval: Optional[tuple]
    clear: Optional[bool]  # the margin's interval excludes 0 (A) or 1 (B); None: no intervals
    level: Optional[float] = None


def _half(interval: Optional[tuple], log: bool) -> Optional[float]:
    if interval is None or not all(np.isfinite(interval)) or (log and min(interval) <= 0):
        return None
    lo, hi = (np.log(v) for v in interval) if log else interval
    return 0.5 * float(hi - lo)


def decide(
    curve_a: Curve,
    curve_b: Curve,
    spec: FitSpec = FitSpec(),
    *,
    fit_a: FitResult,
    fit_b: FitResult,
    boot_a: Optional[Bootstrap] = None,
    boot_b: Optional[Bootstrap] = None,
    margin: float = A_MARGIN,
    n_boot: int = 200,
    level: float = 0.95,
    method: str = "ar1",
    seed: int = 0,
) -> Union[Decision, Comparison, FitFailure]:
    """`compare_fits` plus intervals (module doc). boot_a/boot_b: the runs' own bootstraps
    (for A); the refits at the shared A are bootstrapped here (`n_boot`, 0: none). Returns the
    Comparison or FitFailure as is when there is no winner."""
    c = compare_fits(curve_a, curve_b, spec, fit_a=fit_a, fit_b=fit_b, margin=margin)
    if isinstance(c, FitFailure) or c.winner is None:
        return c
    first_wins = c.winner == c.names[0]
    if c.rule == "A":
        values, log = c.A, False
        intervals = tuple(None if b is None else b.intervals.get("A") for b in (boot_a, boot_b))
        got = next((b.level for b in (boot_a, boot_b) if b is not None), None)
    else:
        values, log = c.B_refit, True  # type: ignore[assignment]  # rule B has its refits
        boots = [
            bootstrap_fit(curve, spec, refit, n_boot=n_boot, level=level, seed=seed, method=method)
            if n_boot
            else None
            for curve, refit in zip((curve_a, curve_b), c.refits)
        ]
        intervals = tuple(None if b is None else b.intervals.get("B") for b in boots)
        got = level if n_boot else None
    win, lose = (0, 1) if first_wins else (1, 0)
    amount = values[win] / values[lose] if log else values[win] - values[lose]
    halves = [_half(iv, log) for iv in intervals]
    span = None if None in halves else float(np.hypot(*halves))  # type: ignore[arg-type]
    interval, clear = None, None
    if span is not None:
        if log:
            interval = (float(amount * np.exp(-span)), float(amount * np.exp(span)))
            clear = interval[0] > 1.0
        else:
            interval = (amount - span, amount + span)
            clear = interval[0] > 0.0
    return Decision(
        comparison=c,
        param=c.rule,
        values=tuple(values),
        intervals=intervals,
        margin=float(amount),
        margin_interval=interval,
        clear=clear,
        level=got,
    )


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


def extrapolate(
    curve: Curve,
    spec: FitSpec = FitSpec(),
    *,
    fraction: float = 0.5,
    split: Optional[float] = None,
    fit: Optional[FitResult] = None,
    n_boot: int = 0,
    band_x: Optional[np.ndarray] = None,
    seed: int = 0,
) -> Union[Extrapolation, FitFailure]:
    """Fit on compute <= split, predict the points after it. split=None: `fraction` of the
    window's largest compute. `fit`: the fit on that window when the caller has it already."""
    if split is None:
        if not 0 < fraction < 1:
            raise ValueError(f"extrapolate: fraction={fraction} must be in (0, 1)")
        window = window_mask(curve, spec)
        if not window.any():
            return FitFailure(reason="no points in the fit window", n_points=0)
        split = fraction * float(curve.x[window].max())
        where = f"{fraction:g} of the largest compute"
    else:
        where = "the given split"
    if split <= spec.fit_start:
        return FitFailure(
            reason=f"split at {split:.4g} ({where}) is not past fit_start = {spec.fit_start:.4g}",
            n_points=0,
        )
    part = dataclasses.replace(spec, fit_end=split)
    heldout = (curve.x > split) & np.isfinite(curve.y)
    if heldout.sum() < 1:
        return FitFailure(
            reason=f"no points after {split:.4g} to check the extrapolation on", n_points=0
        )
    fit = fit if fit is not None else fit_curve(curve, part)
    if not fit.ok:
        return FitFailure(
            reason=f"fit on compute <= {split:.4g}: {fit.reason}", n_points=fit.n_points
        )
    xs, ys = curve.x[heldout], curve.y[heldout]
    err = fit.predict(xs) - ys
    last = np.flatnonzero(xs == xs.max())
    band, coverage = None, None
    if n_boot:
        if band_x is None:
            band_x = np.geomspace(fit.x_range[0], xs.max(), 100)
        band = bootstrap_fit(curve, part, fit, n_boot=n_boot, band_x=band_x, noise=True, seed=seed)
        lo = np.interp(np.log(xs), np.log(band.band_x), band.band_lo)
        hi = np.interp(np.log(xs), np.log(band.band_x), band.band_hi)
        coverage = float(np.mean((ys >= lo) & (ys <= hi)))
    return Extrapolation(
        split=split,
        fit=fit,
        n_heldout=int(heldout.sum()),
        rmse=float(np.sqrt(np.mean(err**2))),
        max_abs_err=float(np.abs(err).max()),
        final_err=float(np.mean(err[last])),
        coverage=coverage,
        band=band,
    )
