"""PNG plots of fitted curves: one per run (points, fit, band, extrapolation) and a comparison.

Log compute axis, as in the paper's figures. Figures are built with matplotlib's object API and
rendered by Agg, without pyplot, so importing this never changes the caller's backend.
"""
from __future__ import annotations

import textwrap
from typing import Optional, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from scalerl_jax.scaling.bootstrap import Bootstrap
from scalerl_jax.scaling.compare import Extrapolation
from scalerl_jax.scaling.fit import Curve, FitResult, FitSpec, window_mask

AXIS_LABELS = {
    "compute.device_hours": "compute (device-hours)",
    "compute.sampler_device_hours": "sampler compute (device-hours)",
    "compute.trainer_device_hours": "trainer compute (device-hours)",
    "compute.flops": "compute (FLOPs)",
    "compute.tokens": "tokens",
    "step": "training step",
    "pass_rate": "pass rate (held-out mean@k)",
}


def _figure():
    fig = Figure(figsize=(7.5, 4.8), dpi=120)
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _save(fig: Figure, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path)
    return path


def axis_label(key: str) -> str:
    return AXIS_LABELS.get(key, key)


def fit_label(fit: FitResult) -> str:
    if not fit.ok:
        return f"no fit ({fit.reason.split(':')[0]})"
    return f"A={fit.A:.3f}, B={fit.B:.2f}, C_mid={fit.C_mid:.3g}"


def _curve_x(curve: Curve, fit: FitResult, target: Optional[float]) -> np.ndarray:
    positive = curve.x[curve.x > 0]
    hi = max(positive.max(), target or 0.0)
    return np.geomspace(positive.min(), hi, 200)


def plot_run(path: str, curve: Curve, spec: FitSpec, fit: FitResult, *,
             boot: Optional[Bootstrap] = None, extrap: Optional[Extrapolation] = None,
             target: Optional[float] = None) -> str:
    fig, ax = _figure()
    on = window_mask(curve, spec) & (curve.x > 0)
    off = ~on & (curve.x > 0)
    ax.scatter(curve.x[on], curve.y[on], s=14, color="C0", label="evaluations (fit window)",
               zorder=3)
    if off.any():
        ax.scatter(curve.x[off], curve.y[off], s=14, facecolors="none", edgecolors="0.5",
                   label="evaluations (outside fit window)", zorder=3)
    xs = _curve_x(curve, fit, target)
    if fit.ok:
        if boot is not None and np.isfinite(boot.band_lo).all():
            ax.fill_between(boot.band_x, boot.band_lo, boot.band_hi, color="C0", alpha=0.18,
                            label=f"{100 * boot.level:.0f}% bootstrap band")
        ax.plot(xs, fit.predict(xs), color="C0", lw=2, label=f"sigmoid fit: {fit_label(fit)}")
        ax.axhline(fit.A, color="C0", ls="--", lw=1, alpha=0.7, label=f"asymptote A = {fit.A:.3f}")
        ax.axhline(fit.R0, color="0.4", ls=":", lw=1, label=f"R0 = {fit.R0:.3f} ({fit.r0_mode})")
    if extrap is not None:
        e = extrap
        if e.band is not None and np.isfinite(e.band.band_lo).all():
            ax.fill_between(e.band.band_x, e.band.band_lo, e.band.band_hi, color="C1",
                            alpha=0.15, label="extrapolation prediction band")
        ax.plot(xs, e.fit.predict(xs), color="C1", lw=1.6, ls="--",
                label=f"fit on compute <= {e.split:.3g}: RMSE on rest {e.rmse:.4f}")
        ax.axvline(e.split, color="C1", lw=0.8, ls=":")
    if target:
        ax.axvline(target, color="0.3", lw=0.8, ls="-.", label=f"target C = {target:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel(axis_label(curve.x_key))
    ax.set_ylabel(axis_label(curve.y_key))
    seeds = f" ({len(curve.seeds)} seeds pooled)" if len(curve.seeds) > 1 else ""
    failure = "" if fit.ok else "\n" + textwrap.fill(f"no fit: {fit.reason}", 95)
    ax.set_title(f"{curve.name}{seeds}{failure}", fontsize=9 if failure else 10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def plot_compare(path: str, curves: Sequence[Curve], fits: Sequence[FitResult],
                 target: Optional[float] = None) -> str:
    fig, ax = _figure()
    for i, (curve, fit) in enumerate(zip(curves, fits)):
        color = f"C{i % 10}"
        pos = curve.x > 0
        ax.scatter(curve.x[pos], curve.y[pos], s=10, color=color, alpha=0.5)
        if fit.ok:
            xs = _curve_x(curve, fit, target)
            ax.plot(xs, fit.predict(xs), color=color, lw=2,
                    label=f"{curve.name}: {fit_label(fit)}")
            ax.axhline(fit.A, color=color, ls="--", lw=0.8, alpha=0.6)
        else:
            ax.plot([], [], color=color, label=f"{curve.name}: {fit_label(fit)}")
    ax.set_xscale("log")
    ax.set_xlabel(axis_label(curves[0].x_key))
    ax.set_ylabel(axis_label(curves[0].y_key))
    ax.set_title("scaling curves (dashed: asymptotes A)", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)
