"""Is the testbed's curve predictable? Seeds of a longer testbed run, each fitted on the first half
of its compute and asked for its final validation pass rate; the online forecasts checked
against where the runs ended; the paper's recipe comparisons at testbed scale.

    python bench/predictability.py                   # everything below, defaults
    python bench/predictability.py --seeds 0 --steps 200 --long-seeds --coverage-seeds --compare
    python bench/predictability.py --out bench/out/pred-lr1e-5 optim.learning_rate=1e-5

Positional KEY=VALUE overrides go to every run's `experiments/run.py` (use a fresh --out for
each set: a workdir refuses a changed config). Runs are reused when complete.

1. Half-compute fit (`--seeds`, `--steps`): the sigmoid law R(C) = R0 + (A - R0) / (1 +
   (C_mid / C)^B) (R0 measured, x = `compute.flops` unless `--x compute.device_hours`) is fitted
   to the evaluations with compute <= half of the run's total, then predicts R at the last
   evaluation's compute; the error is predicted minus observed (the paper's margin: 0.02).
   `--fit-start F` leaves out the evaluations below F x the run's compute (the paper skips its
   first 1.5k GPU-hours), the same share for every seed. Also reported: the pass rate at half
   the compute (interpolated) and the rise from there to the end (a prediction is worth making
   only while the curve still rises), the fit on all points and the last-three mean.
   `--long-seeds`: runs of 2 x --steps, fitted on their first half the same way.
2. Online forecasts: every run's `forecast` records (the trainer refits while it trains) at
   25/50/75% of its compute: does the 95% interval for the final pass rate hold the observed
   last evaluation, and was `stable` shown while it did not? `--coverage-seeds` adds shorter
   runs (`--coverage-steps`, evaluated every `--coverage-eval-every` steps so that a fit exists
   by 25% of their compute) to the seeds of item 1 for this count.
3. Recipe comparisons (`--compare NAME ...`, `--compare-seeds`, `--compare-steps`): the testbed
   with each recipe's documented difference from scalerl (recipes.documented_diff; a larger
   prompts_per_step is scaled to the testbed's batch by the same ratio), its seeds pooled, then
   `experiments/fit.py --compare` (the paper's rule: A apart by more than 0.02 decides, else B).

Everything goes to --out (default bench/out/predictability): one directory per run, results in
predictability.json, the tables in predictability.md (and on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from scalerl_jax import recipes
from scalerl_jax.metrics import eval_xy, read_metrics
from scalerl_jax.scaling import FitSpec, fit_curve
from scalerl_jax.scaling.forecast import forecast, forecast_budget, is_stable
from scalerl_jax.scaling.report import load_curve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FORECAST_SHARES = (0.25, 0.5, 0.75)
COMPARE = ("scalerl", "grpo", "dapo", "scalerl-loo:loss", "scalerl-loo:off-policy")
# Fields of a recipe's difference that size the paper's run rather than choose its method.
SIZE_FIELDS = ("pipeline.prompts_per_step",)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=360)
    p.add_argument(
        "--long-seeds",
        type=int,
        nargs="*",
        default=[0],
        help="runs of 2 x --steps, fitted on their first half",
    )
    p.add_argument(
        "--coverage-seeds",
        type=int,
        nargs="*",
        default=list(range(3, 18)),
        help="more seeds for the forecast check, --coverage-steps long",
    )
    p.add_argument("--coverage-steps", type=int, default=180)
    p.add_argument(
        "--coverage-eval-every",
        type=int,
        default=9,
        help="their evaluation interval: 5 points (a fit) by 25%% of the compute",
    )
    p.add_argument("--compare", nargs="*", default=list(COMPARE), metavar="RECIPE")
    p.add_argument("--compare-seeds", type=int, nargs="*", default=[0, 1])
    p.add_argument("--compare-steps", type=int, default=180)
    p.add_argument("--eval-every", type=int, default=18)
    p.add_argument(
        "--replay",
        action="store_true",
        help="check the forecasts this checkout's forecaster makes from each run's "
        "evaluations instead of those the run wrote (runs made before a forecaster change)",
    )
    p.add_argument(
        "--x",
        default="compute.flops",
        help="compute axis (FLOPs by default: on a shared machine device-hours "
        "also measure the other jobs)",
    )
    p.add_argument(
        "--fit-start",
        type=float,
        default=0.0,
        metavar="F",
        help="fit from F x the run's compute (default 0: from the first evaluation)",
    )
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "predictability"))
    p.add_argument(
        "overrides", nargs="*", metavar="KEY.PATH=VALUE", help="config overrides for every run"
    )
    args = p.parse_args(argv)
    for name in args.compare:
        recipes.documented_diff(name)  # an unknown recipe fails here, before any run
    run = lambda name, seed, steps, extra=(), every=args.eval_every: run_testbed(  # noqa: E731
        args, os.path.join(args.out, name), seed, steps, extra, every
    )
    rows = [half_fit(run(f"seed{s}", s, args.steps), s, args) for s in args.seeds]
    rows += [
        half_fit(run(f"long-seed{s}", s, 2 * args.steps), s, args, kind="2x")
        for s in args.long_seeds
    ]
    runs = [
        (r["seed"], r["kind"], r["workdir"], args.steps * (2 if r["kind"] == "2x" else 1))
        for r in rows
    ]
    runs += [
        (
            s,
            "short",
            run(f"short-seed{s}", s, args.coverage_steps, every=args.coverage_eval_every),
            args.coverage_steps,
        )
        for s in args.coverage_seeds
    ]
    checks = []
    for seed, kind, workdir, steps in runs:
        curve, _ = load_curve([workdir], x_key=args.x)
        final_x, final = float(curve.x[-1]), float(curve.y[-1])
        records = replay_forecasts(workdir, steps, args.x) if args.replay else None
        checks += [
            dict(seed=seed, kind=kind, final=final, **c)
            for c in forecast_checks(workdir, final_x, final, records)
        ]
    comparison = None
    if args.compare:
        dirs = []
        for name in args.compare:
            extra = recipe_overrides(name)
            for s in args.compare_seeds:
                run(
                    os.path.join("compare", name.replace(":", "-"), f"seed{s}"),
                    s,
                    args.compare_steps,
                    extra,
                )
            dirs.append(os.path.join(args.out, "compare", name.replace(":", "-")))
        comparison = compare_recipes(dirs, args)
    text = "\n\n".join(t for t in (half_fit_table(rows), forecast_table(checks), comparison) if t)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "predictability.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "predictability.json"), "w") as f:
        json.dump(
            {"args": vars(args), "rows": rows, "forecasts": checks, "comparison": comparison},
            f,
            indent=2,
        )
    if rows:
        print("wrote", plot_half_fits(rows, args, os.path.join(args.out, "halffit.png")))
    return 0


def run_testbed(args, workdir: str, seed: int, steps: int, extra=(), eval_every: int = 18) -> str:
    """The testbed (with the overrides) for `steps` RL steps, unless it already finished."""
    log = os.path.join(workdir, "metrics.jsonl")
    done = os.path.exists(log) and any(r["step"] == steps for r in read_metrics(workdir).of("eval"))
    if not done:
        cmd = [
            sys.executable,
            os.path.join(ROOT, "experiments", "run.py"),
            "--workdir",
            workdir,
            "--seed",
            str(seed),
            "--steps",
            str(steps),
            f"eval.every_steps={eval_every}",
            f"forecast.x_key={args.x}",
            *args.overrides,
            *extra,
        ]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return workdir


def recipe_overrides(name: str) -> list:
    """KEY=VALUE overrides that give the testbed recipe `name`'s difference from scalerl."""
    testbed, paper = recipes.get("testbed"), recipes.get("scalerl")
    out = []
    for key, value in recipes.documented_diff(name).items():
        if key in SIZE_FIELDS:  # the same ratio to the testbed's size as to the paper's
            section, field = key.split(".")
            base = getattr(getattr(paper, section), field)
            value = round(getattr(getattr(testbed, section), field) * value / base)
        out.append(f"{key}={json.dumps(value) if isinstance(value, bool) else value}")
    return out


def half_fit(workdir: str, seed: int, args, kind: str = "1x") -> dict:
    curve, _ = load_curve([workdir], x_key=args.x)
    half = 0.5 * float(np.nanmax(curve.x))
    first = fit_curve(curve, FitSpec(fit_start=args.fit_start * 2 * half, fit_end=half))
    whole = fit_curve(curve, FitSpec())
    final_x, final_y = float(curve.x[-1]), float(curve.y[-1])
    row = {
        "seed": seed,
        "kind": kind,
        "workdir": workdir,
        "points": len(curve.x),
        "fit_points": first.n_points,
        "base": float(curve.y[0]),
        "final": final_y,
        "final_x": final_x,
        "last3_mean": float(np.mean(curve.y[-3:])),
        "half_compute": half,
        "at_half": float(np.interp(half, curve.x, curve.y)),
        "wall_s": max(r["wall_s"] for r in read_metrics(workdir).of("eval")),
    }
    row.update(rise=final_y - row["at_half"], curve=[round(float(y), 4) for y in curve.y])
    if first.ok:
        pred = float(first.predict(final_x))
        row.update(
            predicted=pred,
            error=pred - final_y,
            A_half=float(first.A),
            B_half=float(first.B),
            C_mid_half=float(first.C_mid),
        )
    else:
        row.update(predicted=None, error=None, reason=first.reason)
    if whole.ok:
        row.update(A=float(whole.A), B=float(whole.B), C_mid=float(whole.C_mid))
    return row


def plot_half_fits(rows: list, args, path: str) -> str:
    """One panel per run: its evaluations (filled up to half the compute, open after), the
    sigmoid fitted on the first half (solid there, dashed beyond) and its prediction of the last
    evaluation against the observed value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.4 * len(rows), 3.4), dpi=110)
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(rows), sharey=True))
    for ax, row in zip(axes, rows):
        curve, _ = load_curve([row["workdir"]], x_key=args.x)
        half = row["half_compute"]
        fit = fit_curve(curve, FitSpec(fit_start=args.fit_start * 2 * half, fit_end=half))
        seen = curve.x <= half
        ax.scatter(curve.x[seen] / 1e12, curve.y[seen], s=12, color="C0", zorder=3)
        ax.scatter(curve.x[~seen] / 1e12, curve.y[~seen], s=12, fc="none", ec="C0", zorder=3)
        if fit.ok:
            xs = np.linspace(curve.x[curve.x > 0].min(), curve.x.max(), 200)
            ys = fit.predict(xs)
            ax.plot(xs[xs <= half] / 1e12, ys[xs <= half], color="C1", lw=1.8)
            ax.plot(xs[xs > half] / 1e12, ys[xs > half], color="C1", lw=1.8, ls="--")
            ax.plot(row["final_x"] / 1e12, row["predicted"], "D", color="C1", ms=6, zorder=4)
        ax.axvline(half / 1e12, color="0.5", lw=0.8, ls=":")
        error = "no fit" if row["error"] is None else f"error {row['error']:+.3f}"
        ax.set_title(f"seed {row['seed']}, {row['kind']}: {error}", fontsize=9)
        ax.set_xlabel("compute (TFLOPs)")
        ax.grid(True, alpha=0.25)
    axes[0].set_ylabel("validation pass rate")
    fig.suptitle(
        "fitted on the first half of the compute (filled points, solid line); "
        "diamond: predicted last evaluation",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    return path


def half_fit_table(rows: list) -> str:
    if not rows:
        return ""
    lines = [
        "Half-compute fit predicting the last evaluation:",
        f"{'seed':>4} {'run':>4} {'pts':>4} {'fit':>4} {'base':>6} {'half':>6} {'final':>6} "
        f"{'rise':>6} {'pred':>6} {'error':>7} {'A(half)':>7} {'B(half)':>7} {'A(all)':>7} "
        f"{'B(all)':>6} {'C_mid(all)':>10} {'wall_s':>6}",
    ]
    for r in rows:
        f = lambda key, fmt: "-" if r.get(key) is None else format(r[key], fmt)  # noqa: E731
        lines.append(
            f"{r['seed']:>4} {r['kind']:>4} {r['points']:>4} {r['fit_points']:>4} "
            f"{r['base']:>6.3f} {r['at_half']:>6.3f} {r['final']:>6.3f} {r['rise']:>+6.3f} "
            f"{f('predicted', '.3f'):>6} {f('error', '+.3f'):>7} {f('A_half', '.3f'):>7} "
            f"{f('B_half', '.2f'):>7} {f('A', '.3f'):>7} {f('B', '.2f'):>6} "
            f"{f('C_mid', '.3g'):>10} {r['wall_s']:>6.0f}"
        )
        if r.get("reason"):
            lines.append(f"     seed {r['seed']}: no fit on the first half: {r['reason']}")
    errors = [abs(r["error"]) for r in rows if r.get("error") is not None]
    if errors:
        rising = sum(r["rise"] >= 0.02 for r in rows)
        lines.append(
            f"mean |error| {np.mean(errors):.3f}, max {np.max(errors):.3f} (paper's "
            f"margin 0.02); within 0.02: {sum(e <= 0.02 for e in errors)}/{len(rows)}; "
            f"still rising by >= 0.02 after half: {rising}/{len(rows)}"
        )
    return "\n".join(lines)


def replay_forecasts(workdir: str, total_steps: int, x_key: str, n_boot: int = 100) -> list:
    """The forecast records this checkout's forecaster makes from the run's evaluations: at each
    one, what the trainer computes there (`forecast` on the points so far, the budget projected
    the same way, the bootstrap seeded by the step, `stable` from the forecasts before it). For
    runs made before a forecaster change; the trainer may also skip an evaluation whose refit
    was superseded, which a replay does not."""
    log = read_metrics(workdir)
    x, y = eval_xy(log, x_key, "pass_rate")
    steps = sorted({r["step"] for r in log.of("eval")})
    records, history = [], []
    for i, step in enumerate(steps):
        budget, budget_range, _ = forecast_budget(None, steps[: i + 1], x[: i + 1], total_steps)
        rec = forecast(
            x[: i + 1],
            y[: i + 1],
            budget=budget,
            budget_range=budget_range,
            target=None,
            n_boot=n_boot,
            seed=step,
            x_key=x_key,
        )
        history.append(rec["A"] if rec["ok"] else None)
        records.append({"step": step, **rec, "stable": is_stable(history)})
    return records


def forecast_checks(workdir: str, final_x: float, final_y: float, records=None) -> list:
    """The run's online forecast (its `forecast` records) at 25/50/75% of its compute: the first
    forecast whose data reach that share, its predicted final pass rate and 95% interval, whether
    the interval holds the observed last evaluation, and whether it was flagged `stable`.
    `records`: forecast records to check instead of the run's own (`replay_forecasts`)."""
    if records is None:
        records = read_metrics(workdir).of("forecast")
    records = [r for r in records if r.get("x_max")]
    out = []
    for share in FORECAST_SHARES:
        rec = next((r for r in records if r["x_max"] >= share * final_x), None)
        if rec is None:
            continue
        lo, hi = rec.get("at_budget_lo"), rec.get("at_budget_hi")
        miss = None if lo is None else max(lo - final_y, final_y - hi, 0.0)
        out.append(
            {
                "share": share,
                "step": rec["step"],
                "ok": rec.get("ok"),
                "predicted": rec.get("at_budget"),
                "lo": lo,
                "hi": hi,
                "covers": None if miss is None else miss == 0.0,  # None: no fit, no interval
                "miss": miss,
                "reason": rec.get("reason"),
                "stable": bool(rec.get("stable")),
            }
        )
    return out


def forecast_table(checks: list) -> str:
    if not checks:
        return ""
    lines = [
        "Online forecast of the final pass rate (95% interval) at a share of the compute:",
        f"{'seed':>4} {'run':>5} {'share':>5} {'step':>5} {'final':>6} {'pred':>6} "
        f"{'interval':>15} {'covers':>6} {'stable':>6}",
    ]
    for c in checks:
        interval = "no fit" if c["lo"] is None else f"[{c['lo']:.3f}, {c['hi']:.3f}]"
        pred = "-" if c["predicted"] is None else f"{c['predicted']:.3f}"
        lines.append(
            f"{c['seed']:>4} {c['kind']:>5} {c['share']:>5.2f} {c['step']:>5} "
            f"{c['final']:>6.3f} {pred:>6} {interval:>15} {str(c['covers']):>6} "
            f"{str(c['stable']):>6}"
        )
    covered = sum(bool(c["covers"]) for c in checks)
    no_fit = sum(c["covers"] is None for c in checks)
    wrong_stable = sum(c["stable"] and (c["miss"] is None or c["miss"] > 0.02) for c in checks)
    lines.append(
        f"intervals holding the final value: {covered}/{len(checks)} (run, share) pairs "
        f"({covered / len(checks):.0%}; goal >= 90%; {no_fit} with no fit yet count as not "
        f"holding) over {len({c['seed'] for c in checks})} seeds; 'stable' while the interval "
        f"missed by > 0.02: {wrong_stable}"
    )
    for reason in sorted({c["reason"] for c in checks if c["covers"] is None and c["reason"]}):
        lines.append(f"  no fit: {reason}")
    return "\n".join(lines)


def compare_recipes(dirs: list, args) -> str:
    """experiments/fit.py --compare on the pooled seeds of each recipe; its table as text."""
    out = os.path.join(args.out, "compare")
    cmd = [
        sys.executable,
        os.path.join(ROOT, "experiments", "fit.py"),
        "--compare",
        *dirs,
        "--x",
        args.x,
        "--out",
        os.path.join(out, "fits"),
        "--compare-dir",
        out,
    ]
    print("$", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    return "Recipe comparisons at testbed scale (experiments/fit.py --compare):\n" + done.stdout


if __name__ == "__main__":
    sys.exit(main())
