"""PNG plots of fitted curves: one per run (points, fit, band, extrapolation) and a comparison.

Log compute axis, as in the paper's figures. Figures are built with matplotlib's object API and
rendered by Agg, without pyplot, so importing this never changes the caller's backend.
"""

from __future__ import annotations

import textwrap
from typing import Any, Optional, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatterSciNotation, LogLocator, NullFormatter

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


def log_x(ax) -> None:
    """A log compute axis. Over one to three decades matplotlib labels every minor tick and the
    labels overlap: there the minor ticks are at 2x and 5x, labelled; wider, decades only."""
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    if not (lo > 0 and hi / lo >= 10):
        return
    if hi / lo < 1000:
        ax.xaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        ax.xaxis.set_minor_formatter(
            LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(3, 3))
        )
    else:
        ax.xaxis.set_minor_formatter(NullFormatter())


def axis_label(key: str) -> str:
    return AXIS_LABELS.get(key, key)


def readable(v: Optional[float]) -> str:
    """3 significant digits, without scientific notation where that reads easily
    (1e-3 <= |v| < 1e6, thousands separated: 2,470; 0.0123), else 2.47e+07."""
    if v is None or not np.isfinite(v):
        return "n/a"
    if v == 0:
        return "0"
    rounded = float(f"{v:.3g}")
    if not 1e-3 <= abs(rounded) < 1e6:
        return f"{v:.3g}"
    decimals = max(0, 2 - int(np.floor(np.log10(abs(rounded)))))
    return f"{rounded:,.{decimals}f}"


def fit_label(fit: FitResult) -> str:
    if not fit.ok:
        return f"no fit ({fit.reason.split(':')[0]})"
    return f"A={fit.A:.3f}, B={fit.B:.2f}, C_mid={readable(fit.C_mid)}"


def _curve_x(curve: Curve, fit: FitResult, target: Optional[float]) -> np.ndarray:
    positive = curve.x[curve.x > 0]
    hi = max(positive.max(), target or 0.0)
    return np.geomspace(positive.min(), hi, 200)


def plot_run(path: str, curve: Curve, spec: FitSpec, fit: FitResult, **kwargs) -> str:
    """`run_figure` written to `path`."""
    fig = run_figure(curve, spec, fit, **kwargs)
    return _save(fig, path)


def run_figure(
    curve: Curve,
    spec: FitSpec,
    fit: FitResult,
    *,
    boot: Optional[Bootstrap] = None,
    extrap: Optional[Extrapolation] = None,
    target: Optional[float] = None,
    at_target: Optional[tuple] = None,
) -> Figure:
    """Points (in and out of the window), the fit with its confidence band, the extrapolation
    check, the fit window's end and the prediction at the target compute (`at_target`:
    (R, lo, hi) from `RunAnalysis.at_target`).

    Drawing order keeps every band visible: the extrapolation's prediction band (for new
    evaluations, hence the wider one) lies underneath, hatched and outlined; the confidence band
    of the fit goes on top, more opaque and outlined too."""
    fig, ax = _figure()
    _draw_points(ax, curve, spec)
    xs = _curve_x(curve, fit, target)
    at_end = extrap is not None and spec.fit_end is not None and extrap.split == spec.fit_end
    if extrap is not None:
        _draw_extrapolation(ax, extrap, xs, at_end=at_end)
    _draw_fit(ax, fit, boot, xs)
    if spec.fit_end is not None:
        check = f": RMSE after it {extrap.rmse:.4f}" if at_end else ""  # type: ignore[union-attr]
        ax.axvline(
            spec.fit_end,
            color="C3",
            lw=1.2,
            ls="--",
            zorder=3,
            label=f"fit end = {readable(spec.fit_end)}{check}",
        )
    if target:
        _draw_target(ax, target, at_target)
    log_x(ax)
    ax.set_xlabel(axis_label(curve.x_key))
    ax.set_ylabel(axis_label(curve.y_key))
    seeds = f" ({len(curve.seeds)} seeds pooled)" if len(curve.seeds) > 1 else ""
    failure = "" if fit.ok else "\n" + textwrap.fill(f"no fit: {fit.reason}", 95)
    ax.set_title(f"{curve.name}{seeds}{failure}", fontsize=9 if failure else 10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _draw_points(ax, curve: Curve, spec: FitSpec) -> None:
    """The evaluations: filled inside the fit window, hollow outside it."""
    on = window_mask(curve, spec) & (curve.x > 0)
    off = ~on & (curve.x > 0)
    ax.scatter(
        curve.x[on], curve.y[on], s=14, color="C0", label="evaluations (fit window)", zorder=4
    )
    if off.any():
        ax.scatter(
            curve.x[off],
            curve.y[off],
            s=14,
            facecolors="none",
            edgecolors="0.35",
            label="evaluations (outside fit window)",
            zorder=4,
        )


def _draw_extrapolation(ax, e: Extrapolation, xs, *, at_end: bool) -> None:
    """The extrapolation check's prediction band and, for a fit on part of the window, its
    own curve and split."""
    if e.band is not None and np.isfinite(e.band.band_lo).all():
        ax.fill_between(
            e.band.band_x,
            e.band.band_lo,
            e.band.band_hi,
            facecolor="none",
            edgecolor="C1",
            hatch="////",
            lw=0.8,
            alpha=0.6,
            zorder=1,
            label=f"{100 * e.band.level:.0f}% prediction band (new evaluations)",
        )
    if not at_end:  # a separate fit on part of the window: its own curve
        ax.plot(
            xs,
            e.fit.predict(xs),
            color="C1",
            lw=1.6,
            ls="--",
            zorder=3,
            label=f"fit on x <= {readable(e.split)}: RMSE on rest {e.rmse:.4f}",
        )
        ax.axvline(e.split, color="C1", lw=0.8, ls=":")


def _draw_fit(ax, fit: FitResult, boot: Optional[Bootstrap], xs) -> None:
    """The fit's confidence band, its curve, the asymptote A and R0."""
    if not fit.ok:
        return
    if boot is not None and np.isfinite(boot.band_lo).all():
        ax.fill_between(
            boot.band_x,
            boot.band_lo,
            boot.band_hi,
            facecolor="C0",
            edgecolor="C0",
            alpha=0.3,
            lw=0.8,
            zorder=2,
            label=f"{100 * boot.level:.0f}% confidence band (fit)",
        )
    ax.plot(xs, fit.predict(xs), color="C0", lw=2, zorder=3, label=f"sigmoid fit: {fit_label(fit)}")
    ax.axhline(fit.A, color="C0", ls="--", lw=1, alpha=0.7, label=f"asymptote A = {fit.A:.3f}")
    ax.axhline(fit.R0, color="0.4", ls=":", lw=1, label=f"R0 = {fit.R0:.3f} ({fit.r0_mode})")


def _draw_target(ax, target: float, at_target: Optional[tuple]) -> None:
    """The target compute and, when given, the prediction there with its interval."""
    ax.axvline(target, color="0.3", lw=0.8, ls="-.", label=f"target C = {readable(target)}")
    if at_target is None:
        return
    r, lo, hi = at_target
    err = [[r - lo], [hi - r]] if np.isfinite(lo) and np.isfinite(hi) else None
    ax.errorbar([target], [r], yerr=err, fmt="D", color="C3", ms=6, capsize=4, zorder=5)
    text = f"R = {r:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if err is not None else "")
    ax.annotate(
        text,
        (target, r),
        xytext=(-10, 12),
        textcoords="offset points",
        ha="right",
        fontsize=8,
        color="C3",
        zorder=5,
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "C3", "lw": 0.6, "alpha": 0.9},
    )


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def run_style(i: int) -> dict:
    """Colour, line style and marker of the i-th run: tab10 colours, and the line style and
    marker cycle at other periods, so no two of the first 40 runs look alike."""
    return {
        "color": f"C{i % 10}",
        "ls": LINE_STYLES[i % len(LINE_STYLES)],
        "marker": MARKERS[i % len(MARKERS)],
    }


def spread_labels(
    values: Sequence[float], gap: float, bounds: Optional[tuple] = None
) -> np.ndarray:
    """Positions for labels at `values` at least `gap` apart, each as near its value as that
    allows (stacked upwards, then the stack centred on the values it labels, then moved inside
    `bounds` (lo, hi) where it sticks out)."""
    at = np.asarray(values, np.float64)
    order = np.argsort(at)
    pos = at[order].copy()
    for i in range(1, len(pos)):
        pos[i] = max(pos[i], pos[i - 1] + gap)
    pos -= (pos - at[order]).mean()
    if bounds is not None and len(pos):
        pos -= max(pos[-1] - bounds[1], 0.0)
        pos += max(bounds[0] - pos[0], 0.0)
    for i in range(1, len(pos)):  # the shifts keep the gaps; re-check against rounding
        pos[i] = max(pos[i], pos[i - 1] + gap)
    out = np.empty_like(pos)
    out[order] = pos
    return out


def log_f(y: np.ndarray, A: float, R0: float) -> np.ndarray:
    """ln((A - R) / (R - R0)); NaN where R is not strictly between R0 and A. Under the law it
    equals B ln C_mid - B ln C: a line of slope -B against ln C."""
    y = np.asarray(y, np.float64)
    inside = (y - R0) * (A - y) > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inside, np.log((A - y) / (y - R0)), np.nan)


def compare_figure(
    curves: Sequence[Curve], fits: Sequence[FitResult], target: Optional[float] = None
) -> Figure:
    """Left: points, fits and asymptotes (labelled at the right edge, kept apart); right: the
    efficiency view, ln((A - R)/(R - R0)) against compute, where each fit is a line of slope -B
    (each run's own A and R0), so a steeper line is a more compute-efficient run. One legend,
    below both panels."""
    fig = Figure(figsize=(13, 5.6), dpi=120)
    FigureCanvasAgg(fig)
    ax, eff = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
    handles, asymptotes = [], []
    for i, (curve, fit) in enumerate(zip(curves, fits)):
        handles.append(_draw_compared_run(ax, eff, curve, fit, run_style(i), target))
        if fit.ok:
            asymptotes.append((fit.A, run_style(i)["color"], curve.name))
    log_x(ax)
    ax.set_xlabel(axis_label(curves[0].x_key))
    ax.set_ylabel(axis_label(curves[0].y_key))
    ax.set_title("scaling curves (thin lines: asymptotes A, labelled right)", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    if asymptotes:
        _label_asymptotes(ax, asymptotes)
    log_x(eff)
    eff.set_xlabel(axis_label(curves[0].x_key))
    eff.set_ylabel("ln((A - R) / (R - R0))")
    eff.set_title(
        "efficiency: each fit is a line of slope -B (steeper = more efficient)", fontsize=10
    )
    eff.grid(True, which="both", alpha=0.25)
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=min(3, max(1, len(handles))),
        fontsize=7,
        frameon=False,
    )
    rows = -(-len(handles) // 3)
    fig.subplots_adjust(left=0.06, right=0.97, top=0.93, bottom=0.13 + 0.035 * rows, wspace=0.42)
    return fig


def _draw_compared_run(ax, eff, curve: Curve, fit: FitResult, st: dict, target) -> Any:
    """One run of `compare_figure`: its points and fit on `ax` (with its asymptote) and on the
    efficiency panel `eff`; returns its legend handle."""
    pos = curve.x > 0
    ax.scatter(
        curve.x[pos],
        curve.y[pos],
        s=12,
        color=st["color"],
        marker=st["marker"],
        alpha=0.45,
        lw=0,
    )
    label = f"{curve.name}: {fit_label(fit)}"
    if not fit.ok:
        return ax.plot([], [], color=st["color"], ls=st["ls"], marker=st["marker"], label=label)[0]
    xs = _curve_x(curve, fit, target)
    handle = ax.plot(
        xs,
        fit.predict(xs),
        color=st["color"],
        ls=st["ls"],
        lw=1.8,
        marker=st["marker"],
        markevery=[len(xs) - 1],
        label=label,
    )[0]
    ax.axhline(fit.A, color=st["color"], ls=st["ls"], lw=0.7, alpha=0.45)
    if fit.A > fit.R0:
        v = log_f(curve.y[pos], fit.A, fit.R0)
        eff.scatter(curve.x[pos], v, s=12, color=st["color"], marker=st["marker"], alpha=0.45, lw=0)
        eff.plot(xs, log_f(fit.predict(xs), fit.A, fit.R0), color=st["color"], ls=st["ls"], lw=1.8)
    return handle


def _label_asymptotes(ax, asymptotes: list) -> None:
    """Label each (A, colour, run name) at the right edge of `ax`, the labels kept apart."""
    lo, hi = ax.get_ylim()
    gap = 0.045 * (hi - lo)  # about 1.5 lines of 7-point text on this figure
    ys = spread_labels([a for a, _, _ in asymptotes], gap=gap, bounds=(lo + gap / 2, hi - gap / 2))
    for (A, color, name), y in zip(asymptotes, ys):
        short = name if len(name) <= 20 else name[:19] + "…"
        ax.annotate(
            f"A={A:.3f} {short}",
            xy=(1.0, A),
            xycoords=("axes fraction", "data"),
            xytext=(1.02, y),
            textcoords=("axes fraction", "data"),
            fontsize=7,
            color=color,
            va="center",
            annotation_clip=False,
            arrowprops={"arrowstyle": "-", "color": color, "lw": 0.6},
        )


def plot_compare(
    path: str, curves: Sequence[Curve], fits: Sequence[FitResult], target: Optional[float] = None
) -> str:
    compare_figure(curves, fits, target).savefig(path)
    return path


def plot_allocation(path: str, rec, x_key: str, y_key: str = "pass_rate") -> str:
    """The allocation's view (`allocate.Recommendation`): each setting's short-run evaluations,
    its fit extrapolated to the budget, and the predicted pass rate there with its interval."""
    fig, ax = _figure()
    for i, opt in enumerate(rec.options):
        color = f"C{i % 10}"
        curve = opt.candidate.curve
        pos = curve.x > 0
        ax.scatter(curve.x[pos], curve.y[pos], s=10, color=color, alpha=0.6)
        if opt.predicted is None:
            ax.plot([], [], color=color, label=f"{opt.candidate.label}: no fit")
            continue
        xs = np.geomspace(curve.x[pos].min(), rec.budget, 200)
        seen = xs <= curve.x[pos].max()
        ax.plot(xs[seen], opt.fit.predict(xs[seen]), color=color, lw=2)
        ax.plot(xs[~seen], opt.fit.predict(xs[~seen]), color=color, lw=1.5, ls="--")
        err = (
            None
            if not np.isfinite(opt.lo)
            else [[opt.predicted - opt.lo], [opt.hi - opt.predicted]]
        )
        ax.errorbar(
            [rec.budget],
            [opt.predicted],
            yerr=err,
            fmt="o",
            color=color,
            capsize=4,
            label=f"{opt.candidate.label}: {opt.predicted:.3f} at budget",
        )
    ax.axvline(rec.budget, color="0.3", lw=0.8, ls="-.")
    log_x(ax)
    ax.set_xlabel(axis_label(x_key))
    ax.set_ylabel(axis_label(y_key))
    best = rec.best
    ax.set_title(
        "allocation at budget {:.3g}: {}".format(
            rec.budget, best.candidate.label if best else "no fit"
        ),
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)
