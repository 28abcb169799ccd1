"""From run directories to a fit report: load curves, analyse, print a table, write fit/ outputs.

A run directory holds `metrics.jsonl` (schema: scalerl_jax/metrics.py). A directory without one
whose subdirectories have one is a multi-seed group: its seeds are pooled into one curve.
A run on a mixture of domains (eval records with `per_domain`) has a curve per domain as well,
y = `per_domain.NAME`: `domain_y_key`, `run_domains`; `fit_run_dir` fits them all.
The fitting, bootstrap and comparison math it calls live in scaling/fit.py, bootstrap.py and
compare.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Sequence

import numpy as np

from scalerl_jax import metrics
from scalerl_jax.scaling import alternatives, plot
from scalerl_jax.scaling.bootstrap import Bootstrap, bootstrap_fit, fit_seeds, seed_spread
from scalerl_jax.scaling.compare import (
    Comparison,
    Decision,
    Extrapolation,
    compare_fits,
    decide,
    extrapolate,
)
from scalerl_jax.scaling.fit import Curve, FitFailure, FitResult, FitSpec, SigmoidFit, fit_curve


def _seed_dirs(run_dir: str) -> list:
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"{run_dir}: not a directory")
    if os.path.exists(os.path.join(run_dir, metrics.FILENAME)):
        return [run_dir]
    subs = sorted(
        os.path.join(run_dir, d)
        for d in os.listdir(run_dir)
        if os.path.exists(os.path.join(run_dir, d, metrics.FILENAME))
    )
    if not subs:
        raise FileNotFoundError(f"{run_dir}: no {metrics.FILENAME} in it or in its subdirectories")
    return subs


def domain_y_key(domain: str) -> str:
    """The eval-record key path of a domain's pass rate."""
    return f"per_domain.{domain}"


def run_domains(run_dirs: Sequence[str]) -> list[str]:
    """The domains with a validation curve in these runs (sorted; [] for single-source runs)."""
    names: set = set()
    for d in (d for run_dir in run_dirs for d in _seed_dirs(run_dir)):
        for record in metrics.read_metrics(d).of("eval"):
            per_domain = record.get("per_domain")
            names.update(per_domain if isinstance(per_domain, dict) else ())
    return sorted(names)


def load_curve(
    run_dirs: Sequence[str],
    name: Optional[str] = None,
    x_key: str = "compute.device_hours",
    y_key: str = "pass_rate",
) -> tuple[Curve, list]:
    """One curve from run dirs (each a run or a group of seed runs); all seeds pooled.

    Returns (curve, notes): notes report skipped malformed lines and an R0 not measured at 0.
    """
    xs, ys, seeds, notes = [], [], [], []
    dirs = [d for run_dir in run_dirs for d in _seed_dirs(run_dir)]
    for i, d in enumerate(dirs):
        log = metrics.read_metrics(d)
        if log.malformed:
            notes.append(
                f"{log.path}: skipped {log.malformed} malformed line(s) "
                f"(line {', '.join(map(str, log.malformed_lines[:5]))})"
            )
        x, y = metrics.eval_xy(log, x_key, y_key)
        if np.nanmin(x) > 0:
            notes.append(
                f"{d}: first evaluation is at {x_key} = {np.nanmin(x):.4g}, not 0; "
                f"a measured R0 comes from it"
            )
        xs.append(x)
        ys.append(y)
        seeds.append(np.full(len(x), i))
    name = name or os.path.basename(os.path.normpath(run_dirs[0]))
    return Curve(
        name,
        np.concatenate(xs),
        np.concatenate(ys),
        np.concatenate(seeds),
        x_key=x_key,
        y_key=y_key,
    ), notes


@dataclasses.dataclass
class RunAnalysis:
    curve: Curve
    fit: FitResult
    target: float
    boot: Optional[Bootstrap] = None
    extrap: Optional[Extrapolation | FitFailure] = None
    per_seed: Optional[dict] = None
    alternatives: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)
    domains: dict = dataclasses.field(default_factory=dict)  # domain -> its RunAnalysis
    spec: FitSpec = FitSpec()

    def at_target(self) -> Optional[tuple[float, float, float]]:
        """(R, lo, hi) predicted at the target compute; lo/hi NaN without a bootstrap."""
        if not self.fit.ok:
            return None
        r = float(self.fit.predict(self.target))
        b = self.boot
        if b is None or not np.isfinite(b.band_lo).all():
            return r, float("nan"), float("nan")
        at = np.log(self.target)
        lo, hi = (float(np.interp(at, np.log(b.band_x), v)) for v in (b.band_lo, b.band_hi))
        return r, lo, hi


def analyse(
    curve: Curve,
    spec: FitSpec,
    *,
    n_boot: int = 200,
    level: float = 0.95,
    interval: str = "ar1",
    block: int = 1,
    target: Optional[float] = None,
    extrapolate_fraction: float = 0.5,
    with_alternatives: bool = False,
    seed: int = 0,
    notes: Sequence[str] = (),
) -> RunAnalysis:
    positive = curve.x[(curve.x > 0) & np.isfinite(curve.x)]
    target = float(target) if target else 2.0 * float(positive.max()) if len(positive) else 1.0
    result = RunAnalysis(
        curve=curve, fit=fit_curve(curve, spec), target=target, notes=list(notes), spec=spec
    )
    fit = result.fit
    if fit.ok and n_boot:
        band_x = np.geomspace(min(target, fit.x_range[0]), max(target, fit.x_range[1]), 120)
        result.boot = bootstrap_fit(
            curve,
            spec,
            fit,
            n_boot=n_boot,
            level=level,
            seed=seed,
            method=interval,
            block=block,
            band_x=band_x,
        )
    if extrapolate_fraction and spec.fit_end is not None:
        # A window that ends is its own extrapolation check: the window's fit, judged on the
        # points after fit_end (and only those).
        result.extrap = extrapolate(
            curve, spec, split=spec.fit_end, fit=fit if fit.ok else None, n_boot=n_boot, seed=seed
        )
    elif extrapolate_fraction:
        result.extrap = extrapolate(
            curve, spec, fraction=extrapolate_fraction, n_boot=n_boot, seed=seed
        )
    if len(curve.seeds) > 1:
        result.per_seed = fit_seeds(curve, spec)
    if with_alternatives:
        result.alternatives = {
            "power law": alternatives.fit_power_law(curve, spec),
            "log-linear (Tan)": alternatives.fit_log_linear(curve, spec),
        }
    return result


def _interval(fit: FitResult, boot: Optional[Bootstrap], name: str, fmt) -> str:
    """'0.612 [0.600, 0.624]'; fmt: a format spec or a function (plot.readable)."""
    show = fmt if callable(fmt) else (lambda v: format(v, fmt))
    value = show(getattr(fit, name))
    if boot is None or name not in boot.intervals:
        return value
    lo, hi = boot.intervals[name]
    return f"{value} [{show(lo)}, {show(hi)}]"


def extrapolation_mode(a: RunAnalysis) -> str:
    """'after fit_end' (the window's fit judged on the points after it) or 'split' (a fit on
    part of the window, judged on the rest)."""
    e = a.extrap
    fit_end = a.spec.fit_end
    return (
        "after fit_end"
        if isinstance(e, Extrapolation) and fit_end is not None and e.split == fit_end
        else "split"
    )


def _extrap_text(a: RunAnalysis) -> str:
    e = a.extrap
    if e is None:
        return "-"
    if isinstance(e, FitFailure):
        return f"n/a: {e.reason}"
    cover = "" if e.coverage is None else f", {100 * e.coverage:.0f}% in band"
    if extrapolation_mode(a) == "after fit_end":
        return (
            f"{e.n_heldout} pts after {plot.readable(e.split)}: RMSE {e.rmse:.4f}, "
            f"last err {e.final_err:+.4f}{cover}"
        )
    return f"fit <= {plot.readable(e.split)}: RMSE {e.rmse:.4f}, end err {e.final_err:+.4f}{cover}"


def _x_fitted(fit: SigmoidFit) -> str:
    lo, hi = fit.x_range
    return f"{plot.readable(lo)}-{plot.readable(hi)}"


def _columns(rows: list) -> str:
    full = [r for r in rows if len(r) == len(rows[0])]
    widths = [max(len(r[i]) for r in full) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        if len(r) == len(widths):
            out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        else:  # a failure row: name, points, then the reason in one cell
            out.append("  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1])] + list(r[2:])))
    return "\n".join(out)


def format_table(analyses: Sequence[RunAnalysis]) -> str:
    level = next((a.boot.level for a in analyses if a.boot is not None), None)
    ci = f" [{100 * level:.0f}% CI]" if level else ""
    rows = [
        [
            "run",
            "pts",
            "x fitted",
            "A" + ci,
            "B" + ci,
            "C_mid" + ci,
            "R0",
            "RMSE",
            "R at target C",
            "extrapolation",
        ]
    ]
    rows += [_fit_row(a) for a in analyses]
    text = [_columns(rows)]
    methods = sorted({f"{a.boot.describe()}" for a in analyses if a.boot is not None})
    if methods:
        text.append("intervals: " + "; ".join(methods))
    for a in analyses:
        if a.per_seed:
            parts = [f"{s}: {f.A:.3f}" if f.ok else f"{s}: no fit" for s, f in a.per_seed.items()]
            spread = seed_spread(a.per_seed)
            extra = "" if spread is None else f" (half-range {spread:.3f}; paper's margin 0.02)"
            text.append(f"{a.curve.name}: per-seed A = {', '.join(parts)}{extra}")
    alt_rows = _alternative_rows(analyses)
    if len(alt_rows) > 1:
        text += ["", "alternative forms (same fit window):", _columns(alt_rows)]
    for a in analyses:
        text += [f"note: {n}" for n in a.notes]
    return "\n".join(text)


def _fit_row(a: RunAnalysis) -> list:
    """A run's row of `format_table`: name, points, then its fit (or why there is none)."""
    f = a.fit
    if not f.ok:
        return [a.curve.name, str(f.n_points), f"no fit: {f.reason}"]
    r, lo, hi = a.at_target()  # type: ignore[misc]  # a fit: never None
    pred = f"{r:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) else "")
    return [
        a.curve.name,
        str(f.n_points),
        _x_fitted(f),
        _interval(f, a.boot, "A", ".3f"),
        _interval(f, a.boot, "B", ".2f"),
        _interval(f, a.boot, "C_mid", plot.readable),
        f"{f.R0:.3f} ({f.r0_mode})",
        f"{f.rmse:.4f}",
        f"{pred} @ {plot.readable(a.target)}",
        _extrap_text(a),
    ]


def _alternative_rows(analyses: Sequence[RunAnalysis]) -> list:
    """The alternative forms' table (its header row first)."""
    alt_rows = [["run", "form", "parameters", "RMSE", "R at target C", "note"]]
    for a in analyses:
        for form, fit in a.alternatives.items():
            if not fit.ok:
                alt_rows.append([a.curve.name, form, f"no fit: {fit.reason}"])
                continue
            params = (
                f"A={fit.A:.3f} B={fit.B:.3f} log D={fit.log_D:.3g}"
                if form == "power law"
                else f"k={fit.k:.4f} E={fit.E:.3f}"
            )
            alt_rows.append(
                [
                    a.curve.name,
                    form,
                    params,
                    f"{fit.rmse:.4f}",
                    f"{float(fit.predict(a.target)):.3f} @ {plot.readable(a.target)}",
                    getattr(fit, "note", ""),
                ]
            )
    return alt_rows


def compare_all(analyses: Sequence[RunAnalysis], spec: FitSpec, margin: float) -> list:
    """Each run against the first (the baseline), by the paper's rule."""
    base = analyses[0]
    return [
        compare_fits(base.curve, a.curve, spec, fit_a=base.fit, fit_b=a.fit, margin=margin)
        for a in analyses[1:]
    ]


def format_comparisons(comparisons: Sequence, margin: float) -> str:
    lines = [f"comparisons against the first run (paper's rule, A margin {margin}):"]
    for c in comparisons:
        lines.append(
            f"  {' vs '.join(c.names)}: {c.summary}"
            if isinstance(c, Comparison)
            else f"  {c.reason}"
        )
    return "\n".join(lines)


def decide_all(
    analyses: Sequence[RunAnalysis],
    spec: FitSpec,
    margin: float,
    *,
    pairwise: bool = False,
    n_boot: int = 200,
    level: float = 0.95,
    interval: str = "ar1",
    seed: int = 0,
) -> list:
    """`compare.decide` for each run against the first, or for every pair (`pairwise`)."""
    n = len(analyses)
    pairs = (
        [(i, j) for i in range(n) for j in range(i + 1, n)]
        if pairwise
        else [(0, j) for j in range(1, n)]
    )
    return [
        decide(
            analyses[i].curve,
            analyses[j].curve,
            spec,
            fit_a=analyses[i].fit,
            fit_b=analyses[j].fit,
            boot_a=analyses[i].boot,
            boot_b=analyses[j].boot,
            margin=margin,
            n_boot=n_boot,
            level=level,
            method=interval,
            seed=seed,
        )
        for i, j in pairs
    ]


def _with_interval(value: float, iv: Optional[tuple], fmt: str) -> str:
    return format(value, fmt) + ("" if iv is None else f" [{iv[0]:{fmt}}, {iv[1]:{fmt}}]")


def format_decisions(decisions: Sequence, margin: float, pairwise: bool = False) -> str:
    """Who wins each comparison, by how much, with the intervals (compare.decide)."""
    which = "every pair" if pairwise else "each run against the first"
    lines = [
        f"recipe comparison, {which} (paper's rule: |A difference| > {margin} -> the "
        f"higher A wins; otherwise both are refitted at their mean A and the higher B "
        f"wins):"
    ]
    for d in decisions:
        if not isinstance(d, Decision):
            lines.append(
                f"  {' vs '.join(d.names)}: {d.summary}"
                if isinstance(d, Comparison)
                else f"  {d.reason}"
            )
            continue
        c = d.comparison
        gap = abs(c.A[0] - c.A[1])
        level = "" if d.level is None else f" ({100 * d.level:.0f}% intervals)"
        none = "0" if d.param == "A" else "1"
        verdict = (
            "no intervals"
            if d.clear is None
            else f"clear: its interval excludes {none}"
            if d.clear
            else f"within noise: its interval includes {none}"
        )
        if d.param == "A":
            lines.append(
                f"  {c.names[0]} vs {c.names[1]}: A decides (|dA| {gap:.3f} > {margin}): "
                f"{c.winner} wins by {_with_interval(d.margin, d.margin_interval, '+.3f')} "
                f"in A ({verdict}); A {_with_interval(d.values[0], d.intervals[0], '.3f')} vs "
                f"{_with_interval(d.values[1], d.intervals[1], '.3f')}{level}"
            )
        else:
            lines.append(
                f"  {c.names[0]} vs {c.names[1]}: B decides (|dA| {gap:.3f} <= {margin}; both "
                f"refitted at A = {c.A_shared:.3f}): {c.winner} is more compute-efficient, B "
                f"ratio {_with_interval(d.margin, d.margin_interval, '.2f')} ({verdict}); B "
                f"{_with_interval(d.values[0], d.intervals[0], '.2f')} vs "
                f"{_with_interval(d.values[1], d.intervals[1], '.2f')}{level}"
            )
    return "\n".join(lines)


def decisions_json(decisions: Sequence) -> list:
    out = []
    for d in decisions:
        if isinstance(d, Decision):
            c = d.comparison
            out.append(
                {
                    "runs": list(c.names),
                    "rule": c.rule,
                    "winner": c.winner,
                    "A": _plain(c.A),
                    "A_shared": _plain(c.A_shared),
                    "B_refit": _plain(c.B_refit),
                    "param": d.param,
                    "values": _plain(d.values),
                    "intervals": _plain(d.intervals),
                    "margin": _plain(d.margin),
                    "margin_interval": _plain(d.margin_interval),
                    "clear": d.clear,
                    "level": d.level,
                    "summary": c.summary,
                }
            )
        else:
            out.append(
                {
                    "runs": list(getattr(d, "names", ())),
                    "winner": None,
                    "reason": getattr(d, "summary", None) or getattr(d, "reason", ""),
                }
            )
    return out


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return {k: _plain(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def to_json(a: RunAnalysis, spec: FitSpec) -> dict:
    fit = {"ok": a.fit.ok, **_plain(a.fit)}
    boot = (
        None
        if a.boot is None
        else {
            "intervals": _plain(a.boot.intervals),
            "n_ok": a.boot.n_ok,
            "n_boot": a.boot.n_boot,
            "level": a.boot.level,
            "method": a.boot.method,
            "block": a.boot.block,
            "rho": _plain(a.boot.rho),
        }
    )
    extrap = None
    if isinstance(a.extrap, Extrapolation):
        extrap = {
            k: _plain(getattr(a.extrap, k))
            for k in ("split", "fit", "n_heldout", "rmse", "max_abs_err", "final_err", "coverage")
        }
        extrap["mode"] = extrapolation_mode(a)
    elif a.extrap is not None:
        extrap = {"ok": False, "reason": a.extrap.reason}
    return {
        "run": a.curve.name,
        "x_key": a.curve.x_key,
        "y_key": a.curve.y_key,
        "seeds": len(a.curve.seeds),
        "spec": _plain(spec),
        "fit": fit,
        "bootstrap": boot,
        "target": a.target,
        "at_target": _plain(a.at_target()),
        "extrapolation": extrap,
        "per_seed": {str(s): {"ok": f.ok, **_plain(f)} for s, f in (a.per_seed or {}).items()},
        "alternatives": {k: {"ok": v.ok, **_plain(v)} for k, v in a.alternatives.items()},
        "notes": a.notes,
    }


def write_run(a: RunAnalysis, spec: FitSpec, out_dir: str, plots: bool = True) -> list:
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "fit.txt"), os.path.join(out_dir, "fit.json")]
    with open(paths[0], "w") as f:
        f.write(format_table([a]) + "\n")
    with open(paths[1], "w") as f:
        json.dump(to_json(a, spec), f, indent=2)
    if plots:
        extrap = a.extrap if isinstance(a.extrap, Extrapolation) else None
        paths.append(
            plot.plot_run(
                os.path.join(out_dir, "fit.png"),
                a.curve,
                spec,
                a.fit,
                boot=a.boot,
                extrap=extrap,
                target=a.target,
                at_target=a.at_target(),
            )
        )
    return paths


def fit_run_dir(
    run_dir: str,
    spec: FitSpec = FitSpec(),
    *,
    n_boot: int = 200,
    seed: int = 0,
    plots: bool = True,
    out: Optional[str] = None,
) -> tuple[RunAnalysis, list]:
    """Fit one run directory's validation curve with the defaults of `experiments/fit.py` and
    write RUN_DIR/fit/ (or `out`; what a training run does at its end). Returns
    (analysis, files).

    A mixture's run also gets each domain's curve fitted (`analysis.domains`), written to
    RUN_DIR/fit/DOMAIN/, and RUN_DIR/fit/fit.txt lists the overall row and one per domain."""
    curve, notes = load_curve([run_dir])
    analysis = analyse(curve, spec, n_boot=n_boot, seed=seed, notes=notes)
    out = out or os.path.join(run_dir, "fit")
    files = write_run(analysis, spec, out, plots=plots)
    for domain in run_domains([run_dir]):
        sub, sub_notes = load_curve(
            [run_dir], name=f"{curve.name}:{domain}", y_key=domain_y_key(domain)
        )
        analysis.domains[domain] = analyse(sub, spec, n_boot=n_boot, seed=seed, notes=sub_notes)
        files += write_run(analysis.domains[domain], spec, os.path.join(out, domain), plots=plots)
    if analysis.domains:
        with open(files[0], "w") as f:  # fit.txt: the overall row, then each domain's
            f.write(format_table([analysis, *analysis.domains.values()]) + "\n")
    return analysis, files


def headline(a: RunAnalysis) -> Optional[dict]:
    """{"A", "B", "C_mid"} with "<name>_lo" / "<name>_hi" interval ends when bootstrapped; None
    when the fit failed (its reason is `a.fit.reason`). See `domain_headlines` for domains."""
    if not a.fit.ok:
        return None
    out = {name: float(getattr(a.fit, name)) for name in ("A", "B", "C_mid")}
    for name, (lo, hi) in a.boot.intervals.items() if a.boot is not None else ():
        if name in out:
            out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
    return out


def domain_headlines(a: RunAnalysis) -> dict:
    """{domain: headline dict, or {"reason": why there is no fit}} of a mixture's run."""
    return {d: headline(sub) or {"reason": sub.fit.reason} for d, sub in a.domains.items()}
